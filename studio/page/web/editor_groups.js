/* Groups (a part of studio/page/web/node_editor.js): titled frames drawn behind the nodes.
 *
 * Dragging a group's title moves the group and every node lying wholly inside it (ComfyUI's rule:
 * a group holds no list of nodes, its frame decides); its corner resizes it; a double-click on the
 * title renames it; its title's right-click menu renames, colours or removes it. Made from the
 * canvas menu ("Add group here") or around the selected nodes (Ctrl+G). Kept in the workflow JSON
 * as "groups" (studio/workflows/layout.py); the compiler never reads them.
 */
(function () {
  "use strict";

  const PAD = 20, TITLE = 34; // room around grouped nodes, and above them for the title
  const MIN_W = 120, MIN_H = 60;

  class Groups {
    constructor(editor, kit) {
      this.editor = editor;
      this.h = kit.h;
      this.items = [];
      editor.on("saving", (workflow) => {
        if (!this.items.length) return;
        workflow.groups = this.items.map((g) => this.toJson(g));
      });
      editor.on("loaded", (workflow) => this.setAll(Array.isArray(workflow.groups) ? workflow.groups : []));
    }

    // ------------------------------------------------------------------ the list
    setAll(groups) {
      for (const group of this.items) group.el.remove();
      this.items = [];
      for (const g of groups) this.fromJson(g);
    }

    toJson(g) {
      return { title: g.title, position: [Math.round(g.x), Math.round(g.y)], size: [Math.round(g.w), Math.round(g.h)],
               ...(g.color ? { color: g.color } : {}) };
    }

    fromJson(g, dx = 0, dy = 0) {
      // A group from the workflow JSON (shifted by dx, dy: a pasted one); one with a bad frame is left out.
      const [x, y] = g.position || [0, 0], [w, h] = g.size || [0, 0];
      if ([x, y, w, h].every(Number.isFinite) && w > 0 && h > 0) this.make({ title: String(g.title || ""), x: x + dx, y: y + dy, w, h, color: g.color || null });
    }

    make(group) {
      const title = this.h("div", { class: "sse-group-title", title: "Drag to move the group and its nodes; double-click to rename" });
      const corner = this.h("div", { class: "sse-group-corner", title: "Drag to resize" });
      group.el = this.h("div", { class: "sse-group" }, [title, corner]);
      group.titleEl = title;
      title.addEventListener("mousedown", (e) => this.drag(e, group, "move"));
      corner.addEventListener("mousedown", (e) => this.drag(e, group, "resize"));
      title.addEventListener("dblclick", (e) => { e.stopPropagation(); this.rename(group); });
      // Behind every node and link: the first thing on drawflow's canvas (drawflow's clear() empties
      // it; the editor's "loaded" event draws the groups again).
      const pre = this.editor.df.precanvas;
      pre.insertBefore(group.el, pre.firstChild);
      this.items.push(group);
      this.draw(group);
      return group;
    }

    draw(group) {
      Object.assign(group.el.style, { left: group.x + "px", top: group.y + "px", width: group.w + "px", height: group.h + "px" });
      group.el.style.setProperty("--sse-group-color", group.color || "#64748b");
      group.titleEl.textContent = group.title || "Group";
      group.el.dataset.title = group.title;
    }

    add(point) {
      const group = this.make({ title: "Group", x: point.x, y: point.y, w: 360, h: 240, color: null });
      this.editor.changed();
      this.editor.say("Added a group: drag its title to move it with the nodes inside, its corner to resize it.");
      return group;
    }

    around(ids) {
      const boxes = ids.map((id) => this.nodeBox(id)).filter(Boolean);
      if (!boxes.length) { this.editor.say("Select nodes to group first."); return null; }
      const x = Math.min(...boxes.map((b) => b.x)) - PAD, y = Math.min(...boxes.map((b) => b.y)) - PAD - TITLE;
      const right = Math.max(...boxes.map((b) => b.x + b.w)) + PAD, bottom = Math.max(...boxes.map((b) => b.y + b.h)) + PAD;
      const group = this.make({ title: "Group", x, y, w: right - x, h: bottom - y, color: null });
      this.editor.changed();
      this.editor.say(`Grouped ${boxes.length} node${boxes.length === 1 ? "" : "s"}.`);
      return group;
    }

    remove(group) {
      group.el.remove();
      this.items = this.items.filter((g) => g !== group);
      this.editor.changed();
      this.editor.say("Removed the group (its nodes stay).");
    }

    // ------------------------------------------------------------------ geometry
    nodeBox(id) {
      const node = this.editor.df.drawflow.drawflow.Home.data[id], el = this.editor.nodeElement(id);
      return node && el ? { id: String(id), x: node.pos_x, y: node.pos_y, w: el.offsetWidth, h: el.offsetHeight } : null;
    }

    inside(group) {
      return Object.keys(this.editor.df.drawflow.drawflow.Home.data).map((id) => this.nodeBox(id)).filter((b) =>
        b && b.x >= group.x && b.y >= group.y && b.x + b.w <= group.x + group.w && b.y + b.h <= group.y + group.h);
    }

    heldBy(ids) {
      // The groups a copy of these nodes takes along: those holding at least one node, all of them
      // copied (as JSON: title, position, size, colour).
      const copied = new Set(ids.map(String));
      return this.items.filter((g) => {
        const held = this.inside(g);
        return held.length > 0 && held.every((b) => copied.has(b.id));
      }).map((g) => this.toJson(g));
    }

    drag(event, group, how) {
      if (event.button !== 0) return;
      event.stopPropagation(); // not a pan (drawflow)
      event.preventDefault();
      const zoom = this.editor.df.zoom, start = { x: event.clientX, y: event.clientY };
      const from = { x: group.x, y: group.y, w: group.w, h: group.h };
      const nodes = how === "move" ? this.inside(group) : [];
      let moved = false;
      const move = (e) => {
        const dx = (e.clientX - start.x) / zoom, dy = (e.clientY - start.y) / zoom;
        moved = moved || dx !== 0 || dy !== 0;
        if (how === "move") {
          Object.assign(group, { x: from.x + dx, y: from.y + dy });
          for (const box of nodes) this.editor.moveNodeTo(box.id, box.x + dx, box.y + dy);
        } else {
          Object.assign(group, { w: Math.max(MIN_W, from.w + dx), h: Math.max(MIN_H, from.h + dy) });
        }
        this.draw(group);
        this.editor.emit("view");
      };
      const up = () => {
        window.removeEventListener("mousemove", move);
        window.removeEventListener("mouseup", up, true);
        if (moved) this.editor.changed();
      };
      window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", up, true);
    }

    // ------------------------------------------------------------------ title and menu
    rename(group) {
      const input = this.h("input", { type: "text", class: "sse-group-rename", value: group.title, maxlength: "200" });
      group.titleEl.textContent = "";
      group.titleEl.appendChild(input);
      input.focus();
      input.select();
      let done = false;
      const finish = (keep) => {
        if (done) return;
        done = true;
        const changed = keep && input.value !== group.title;
        if (changed) group.title = input.value;
        input.remove();
        this.draw(group);
        if (changed) this.editor.changed();
      };
      input.addEventListener("keydown", (e) => {
        e.stopPropagation();
        if (e.key === "Enter") finish(true);
        else if (e.key === "Escape") finish(false);
      });
      input.addEventListener("mousedown", (e) => e.stopPropagation());
      input.addEventListener("blur", () => finish(true));
    }

    menu(el) {
      const group = this.items.find((g) => g.el === el);
      if (!group) return null;
      const paint = (color) => { group.color = color; this.draw(group); this.editor.changed(); };
      const swatches = this.editor.colors.swatches.map(([name, color]) => ({ label: name, color, run: () => paint(color) }))
        .concat([{ label: "No colour", run: () => paint(null) }]);
      return [
        { label: "Rename", hint: "double-click", run: () => this.rename(group) },
        { label: "Colour", items: swatches },
        { label: "Select its nodes", run: () => this.editor.selection.set(this.inside(group).map((b) => b.id)) },
        { label: "Remove group", hint: "keeps its nodes", run: () => this.remove(group) },
      ];
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.groups = new Groups(editor, kit);
  });
})();
