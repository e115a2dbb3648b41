/* Several nodes selected at once (a part of studio/page/web/node_editor.js).
 *
 * drawflow selects one node. On top of it: Shift or Ctrl+click adds a node to the selection or
 * takes it out, Shift or Ctrl+drag on empty canvas draws a box that selects the nodes it touches
 * (Shift adds to what was selected), dragging one selected node moves them all, and the editor's
 * Delete, copy and group gestures act on all of them. A plain drag on the canvas still pans.
 */
(function () {
  "use strict";

  class Selection {
    constructor(editor, kit) {
      this.editor = editor;
      this.df = editor.df;
      this.h = kit.h;
      this.ids = new Set();
      // Capture phase on the canvas's parent: decided before drawflow's own mousedown.
      editor.canvas.parentElement.addEventListener("mousedown", (e) => this.onMouseDown(e), true);
      this.df.on("mouseMove", () => this.followDrag());
      window.addEventListener("mouseup", () => this.onMouseUp());
      editor.on("loaded", () => this.set([]));
      editor.on("committed", () => this.prune());
    }

    // ------------------------------------------------------------------ what is selected
    data() {
      return this.df.drawflow.drawflow.Home.data;
    }

    selected() {
      // The selected nodes that still exist, or drawflow's one selected node.
      const data = this.data();
      const ids = [...this.ids].filter((id) => data[id]);
      const single = this.df.node_selected && this.df.node_selected.id.slice(5);
      if (!ids.length && single && data[single]) ids.push(single);
      return ids;
    }

    set(ids) {
      for (const el of this.editor.canvas.querySelectorAll(".drawflow-node.sse-picked")) el.classList.remove("sse-picked");
      this.ids = new Set(ids.map(String));
      if (this.df.node_selected && !this.ids.has(this.df.node_selected.id.slice(5))) {
        this.df.node_selected.classList.remove("selected");
        this.df.node_selected = null;
      }
      for (const id of this.ids) {
        const el = this.editor.nodeElement(id);
        if (el) el.classList.add("sse-picked");
      }
      this.editor.root.dataset.selected = String(this.ids.size);
    }

    toggle(id) {
      const ids = new Set(this.selected());
      if (ids.has(id)) ids.delete(id);
      else ids.add(id);
      this.set([...ids]);
    }

    selectAll() {
      this.set(Object.keys(this.data()));
      this.editor.say(`Selected ${this.ids.size} nodes.`);
    }

    prune() {
      const data = this.data();
      if ([...this.ids].some((id) => !data[id])) this.set([...this.ids].filter((id) => data[id]));
    }

    remove() {
      const ids = this.selected();
      if (!ids.length) return false;
      const data = this.data();
      // Every removal in this one task: one undo entry (the editor commits once per task).
      for (const id of ids) if (data[id]) this.df.removeNodeId("node-" + id);
      this.set([]);
      this.editor.say(`Deleted ${ids.length} node${ids.length === 1 ? "" : "s"} (Undo brings ${ids.length === 1 ? "it" : "them"} back).`);
      return true;
    }

    // ------------------------------------------------------------------ mouse
    onMouseDown(event) {
      if (event.button !== 0 || !this.editor.canvas.contains(event.target)) return;
      const adding = event.shiftKey || event.ctrlKey || event.metaKey;
      const nodeEl = event.target.closest(".drawflow-node");
      const onControl = event.target.closest(".input, .output, input, textarea, select, button, .sse-delete");
      if (nodeEl && !onControl) {
        const id = nodeEl.id.slice(5);
        if (adding) {
          event.stopPropagation(); // drawflow would select this one node and start dragging it
          event.preventDefault();
          this.toggle(id);
          return;
        }
        if (!this.ids.has(id) || this.ids.size < 2) this.set([id]);
        else this.pressed = { id, x: event.clientX, y: event.clientY }; // a click without a move selects it alone
        this.dragStart = new Map(this.selected().map((nid) => [nid, { x: this.data()[nid].pos_x, y: this.data()[nid].pos_y }]));
        this.dragAnchor = id;
        return;
      }
      if (!this.editor.onBackground(event.target)) return;
      if (!adding) { this.set([]); return; } // a plain drag pans (drawflow)
      event.stopPropagation();
      event.preventDefault();
      this.startBox(event);
    }

    followDrag() {
      // drawflow moved the node under the mouse; the other selected nodes follow it.
      if (!this.df.drag || !this.dragStart || this.dragStart.size < 2) return;
      const data = this.data();
      const anchor = data[this.dragAnchor], start = this.dragStart.get(this.dragAnchor);
      if (!anchor || !start) return;
      const dx = anchor.pos_x - start.x, dy = anchor.pos_y - start.y;
      if (this.pressed && (dx || dy)) this.pressed = null;
      for (const [id, from] of this.dragStart) {
        if (id !== this.dragAnchor) this.editor.moveNodeTo(id, from.x + dx, from.y + dy);
      }
    }

    onMouseUp() {
      if (this.pressed) this.set([this.pressed.id]);
      this.pressed = null;
      this.dragStart = null;
    }

    // ------------------------------------------------------------------ the box
    startBox(event) {
      const canvas = this.editor.canvas, origin = canvas.getBoundingClientRect();
      const start = { x: event.clientX, y: event.clientY };
      const before = event.shiftKey ? this.selected() : [];
      const box = this.h("div", { class: "sse-select-box" });
      canvas.appendChild(box);
      const rect = (e) => ({ left: Math.min(start.x, e.clientX), top: Math.min(start.y, e.clientY),
                             right: Math.max(start.x, e.clientX), bottom: Math.max(start.y, e.clientY) });
      const move = (e) => {
        const r = rect(e);
        Object.assign(box.style, { left: r.left - origin.left + "px", top: r.top - origin.top + "px",
                                   width: r.right - r.left + "px", height: r.bottom - r.top + "px" });
      };
      const up = (e) => {
        window.removeEventListener("mousemove", move);
        window.removeEventListener("mouseup", up, true);
        box.remove();
        const r = rect(e);
        const touched = [...canvas.querySelectorAll(".drawflow-node")].filter((el) => {
          const b = el.getBoundingClientRect();
          return b.left < r.right && b.right > r.left && b.top < r.bottom && b.bottom > r.top;
        }).map((el) => el.id.slice(5));
        this.set([...new Set([...before, ...touched])]);
        if (touched.length) this.editor.say(`Selected ${this.ids.size} node${this.ids.size === 1 ? "" : "s"}: drag one to move them, Delete removes them.`);
      };
      move(event);
      window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", up, true);
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.selection = new Selection(editor, kit);
  });
})();
