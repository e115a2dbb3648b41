/* Bypassed nodes (a part of studio/page/web/node_editor.js): a node that passes its inputs
 * through instead of running, as in ComfyUI; drawn faded, tinted purple. Its right-click menu's
 * Bypass (Stop bypassing) and Ctrl+B toggle the selection, one undo entry each. Kept in the workflow
 * JSON as the node's "bypass": true; what passes through is the compiler's business
 * (studio/workflows/bypass.py).
 */
(function () {
  "use strict";

  class Bypass {
    constructor(editor) {
      this.editor = editor;
      editor.on("saving", (workflow) => {
        for (const node of workflow.nodes) if (this.is(node.id)) node.bypass = true;
      });
      editor.on("loaded", (workflow, ids) => {
        for (const node of workflow.nodes) if (node.bypass === true && ids[String(node.id)] !== undefined) this.set(ids[String(node.id)], true);
      });
      editor.on("inserted", (node, id) => this.set(id, node.bypass === true)); // pasted, duplicated
    }

    is(id) {
      const el = this.editor.nodeElement(id);
      return !!el && el.classList.contains("sse-bypassed");
    }

    set(id, on) {
      const el = this.editor.nodeElement(id);
      if (!el) return;
      el.classList.toggle("sse-bypassed", on);
      el.querySelector(".sse-title").title = on ? "Bypassed: passes its inputs through (Ctrl+B runs it again)" : "";
    }

    // What a toggle of `ids` does: bypass them all, unless every one is bypassed already.
    turnsOn(ids) {
      return !ids.every((id) => this.is(id));
    }

    toggle(ids) {
      if (!ids.length) { this.editor.say("Select nodes to bypass first (click one, or Shift+drag a box)."); return false; }
      const on = this.turnsOn(ids);
      for (const id of ids) this.set(id, on);
      this.editor.changed();
      const what = `${ids.length} node${ids.length === 1 ? "" : "s"}`;
      this.editor.say(on ? `Bypassed ${what}: ${ids.length === 1 ? "it passes its" : "they pass their"} inputs through (Ctrl+B again runs ${ids.length === 1 ? "it" : "them"}).`
                         : `Stopped bypassing ${what}.`);
      return true;
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor) => {
    editor.bypass = new Bypass(editor);
  });
})();
