/* Node colours (a part of studio/page/web/node_editor.js): a node's title bar in a colour the user
 * picks from its right-click menu. Kept in the workflow JSON as the node's "color" (see
 * studio/workflows/layout.py); the compiler never reads it.
 */
(function () {
  "use strict";

  // The swatches of the node and group menus (ComfyUI's choices, in this page's light theme).
  const SWATCHES = [["Red", "#dc2626"], ["Orange", "#ea580c"], ["Yellow", "#ca8a04"], ["Green", "#16a34a"],
                    ["Cyan", "#0891b2"], ["Blue", "#2563eb"], ["Purple", "#7c3aed"], ["Pink", "#db2777"],
                    ["Grey", "#4b5563"]];

  class NodeColors {
    constructor(editor) {
      this.editor = editor;
      this.swatches = SWATCHES;
      editor.on("saving", (workflow) => {
        for (const node of workflow.nodes) {
          const el = editor.nodeElement(node.id);
          if (el && el.dataset.color) node.color = el.dataset.color;
        }
      });
      editor.on("loaded", (workflow, ids) => {
        for (const node of workflow.nodes) if (node.color && ids[String(node.id)] !== undefined) this.set(ids[String(node.id)], node.color);
      });
      editor.on("inserted", (node, id) => { if (node.color) this.set(id, node.color); }); // pasted, duplicated
    }

    set(id, color) {
      const el = this.editor.nodeElement(id);
      if (!el) return;
      const valid = typeof color === "string" && /^#[0-9a-fA-F]{6}$/.test(color);
      if (valid) el.dataset.color = color.toLowerCase();
      else delete el.dataset.color;
      el.querySelector(".sse-title").style.background = valid ? color : "";
    }

    of(id) {
      const el = this.editor.nodeElement(id);
      return el ? el.dataset.color || null : null;
    }

    paint(ids, color) {
      for (const id of ids) this.set(id, color);
      this.editor.changed();
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor) => {
    editor.colors = new NodeColors(editor);
  });
})();
