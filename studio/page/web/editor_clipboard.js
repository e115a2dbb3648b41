/* Copy, paste and duplicate (a part of studio/page/web/node_editor.js).
 *
 * What is copied is a piece of workflow JSON: the selected nodes (values, colours, bypass,
 * positions), the links between them, and the groups that hold copied nodes only. It goes to the
 * browser's storage, which every tab of this studio shares, and to the system clipboard through the
 * page's copy event, so Ctrl+V pastes it in this tab, another tab, or another browser. A paste lands where the mouse is (else next to the originals),
 * and the pasted nodes end up selected, ready to be moved together.
 */
(function () {
  "use strict";

  const CLIPBOARD_KEY = "stepstudio.clipboard";
  const KIND = "stepstudio-nodes";
  const OFFSET = 30; // a duplicate's shift from its original, in canvas pixels

  class Clipboard {
    constructor(editor) {
      this.editor = editor;
      this.pointer = null; // the last mouse position over the canvas (client pixels)
      editor.canvas.addEventListener("mousemove", (e) => { this.pointer = { x: e.clientX, y: e.clientY }; });
      editor.canvas.addEventListener("mouseleave", () => { this.pointer = null; });
      document.addEventListener("copy", (e) => this.onCopyEvent(e));
      document.addEventListener("paste", (e) => this.onPasteEvent(e));
    }

    // ------------------------------------------------------------------ fragments
    fragment(ids) {
      const wanted = new Set(ids.map(String));
      const workflow = this.editor.toWorkflow();
      const nodes = workflow.nodes.filter((n) => wanted.has(n.id));
      const links = workflow.links.filter((l) => wanted.has(l.from.node) && wanted.has(l.to.node));
      const groups = this.editor.groups ? this.editor.groups.heldBy(ids) : [];
      return { kind: KIND, version: 1, nodes, links, groups };
    }

    parse(text) {
      try {
        const fragment = JSON.parse(text);
        return fragment && fragment.kind === KIND && Array.isArray(fragment.nodes) ? fragment : null;
      } catch (e) { return null; }
    }

    insert(fragment, at) {
      // New nodes for the fragment's, `at` (canvas pixels) the top-left of them all; returns their ids.
      const editor = this.editor;
      const xs = fragment.nodes.map((n) => (n.position || [0, 0])[0]), ys = fragment.nodes.map((n) => (n.position || [0, 0])[1]);
      const dx = at.x - Math.min(...xs), dy = at.y - Math.min(...ys);
      const ids = {};
      for (const node of fragment.nodes) {
        if (!editor.types[node.type]) continue;
        const [x, y] = node.position || [0, 0];
        const id = editor.addNode(node.type, x + dx, y + dy, node.values || {});
        editor.syncFields(id);
        editor.emit("inserted", node, id); // the parts restore what they keep (colour, bypass)
        ids[node.id] = id;
      }
      for (const link of fragment.links || []) {
        const from = ids[link.from.node], to = ids[link.to.node];
        if (from === undefined || to === undefined) continue;
        const out = editor.types[editor.nodeData(from).name].outputs.findIndex((p) => p.name === link.from.port);
        const inp = editor.types[editor.nodeData(to).name].inputs.findIndex((p) => p.name === link.to.port);
        if (out >= 0 && inp >= 0) editor.df.addConnection(from, to, "output_" + (out + 1), "input_" + (inp + 1));
      }
      if (editor.groups && Object.keys(ids).length) {
        for (const g of fragment.groups || []) editor.groups.fromJson(g, dx, dy); // moved with the nodes
        editor.changed(); // one undo entry with the nodes
      }
      const added = Object.values(ids).map(String);
      if (editor.selection) editor.selection.set(added);
      return added;
    }

    // ------------------------------------------------------------------ gestures
    selectedIds() {
      return this.editor.selection ? this.editor.selection.selected() : [];
    }

    copy() {
      const ids = this.selectedIds();
      if (!ids.length) { this.editor.say("Select nodes to copy first (click one, or Shift+drag a box)."); return false; }
      this.text = JSON.stringify(this.fragment(ids));
      this.copying = true; // the copy event that follows Ctrl+C puts it on the system clipboard too
      setTimeout(() => { this.copying = false; }, 0);
      try { localStorage.setItem(CLIPBOARD_KEY, this.text); } catch (e) { /* too large for storage: this tab keeps it */ }
      // From the menu no copy event follows; the clipboard API (secure pages only) writes it instead.
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(this.text).catch(() => {});
      this.editor.say(`Copied ${ids.length} node${ids.length === 1 ? "" : "s"}: Ctrl+V pastes, in this tab or another.`);
      return true;
    }

    stored() {
      let text = null;
      try { text = localStorage.getItem(CLIPBOARD_KEY); } catch (e) { /* storage disabled */ }
      return this.parse(text) || this.parse(this.text);
    }

    requestPaste() {
      // Ctrl+V: the paste event brings the system clipboard; without one, the stored copy is pasted.
      this.pastePending = true;
      setTimeout(() => { if (this.pastePending) { this.pastePending = false; this.paste(this.stored()); } }, 0);
    }

    paste(fragment, at) {
      if (!fragment || !fragment.nodes.length) { this.editor.say("Nothing to paste: copy nodes first (Ctrl+C)."); return []; }
      const point = at || (this.pointer ? this.editor.toCanvas(this.pointer.x, this.pointer.y) : this.besideOriginals(fragment));
      const added = this.insert(fragment, point);
      this.editor.say(`Pasted ${added.length} node${added.length === 1 ? "" : "s"}.`);
      return added;
    }

    besideOriginals(fragment) {
      const xs = fragment.nodes.map((n) => (n.position || [0, 0])[0]), ys = fragment.nodes.map((n) => (n.position || [0, 0])[1]);
      return { x: Math.min(...xs) + OFFSET, y: Math.min(...ys) + OFFSET };
    }

    duplicate() {
      const ids = this.selectedIds();
      if (!ids.length) { this.editor.say("Select nodes to duplicate first."); return []; }
      const fragment = this.fragment(ids);
      const added = this.insert(fragment, this.besideOriginals(fragment));
      this.editor.say(`Duplicated ${added.length} node${added.length === 1 ? "" : "s"}.`);
      return added;
    }

    // ------------------------------------------------------------------ the system clipboard
    onCopyEvent(event) {
      if (!this.copying || !event.clipboardData) return;
      event.clipboardData.setData("text/plain", this.text);
      event.preventDefault();
    }

    onPasteEvent(event) {
      if (!this.pastePending) return;
      this.pastePending = false;
      const text = event.clipboardData ? event.clipboardData.getData("text/plain") : "";
      event.preventDefault();
      this.paste(this.parse(text) || this.stored());
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor) => {
    editor.clipboard = new Clipboard(editor);
  });
})();
