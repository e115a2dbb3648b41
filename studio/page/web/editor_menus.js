/* Right-click menus (a part of studio/page/web/node_editor.js).
 *
 * On the canvas: search, add a node by category, add a group, paste, select all, fit. On a node
 * (or the selection it is part of): duplicate, copy, delete, bypass, colour, group. On a link:
 * delete it. On a group's title: the group's own menu (editor_groups.js). drawflow's own
 * right-click (a lone "x" on the selected node or link) never shows: the menu is decided before
 * drawflow sees the event.
 */
(function () {
  "use strict";

  const CATEGORIES = [["values", "Values"], ["fan-out", "Fan-out"], ["pictures", "Pictures"], ["sampler", "Sampler"],
                      ["outputs", "Outputs"]];

  class Menus {
    constructor(editor, kit) {
      this.editor = editor;
      this.h = kit.h;
      const body = editor.canvas.parentElement;
      body.addEventListener("contextmenu", (e) => this.onContextMenu(e), true);
      // drawflow starts a drag or a pan on any button; a right press that opens a menu is
      // released over the menu, where drawflow never hears it end: it never sees the press.
      body.addEventListener("mousedown", (e) => { if (e.button === 2 && editor.canvas.contains(e.target)) e.stopPropagation(); }, true);
      document.addEventListener("mousedown", (e) => { if (this.menu && !this.menu.contains(e.target)) this.close(); }, true);
      window.addEventListener("keydown", (e) => {
        if (this.menu && e.key === "Escape") { e.stopImmediatePropagation(); this.close(); }
      }, true);
      editor.canvas.addEventListener("wheel", () => this.close());
    }

    onContextMenu(event) {
      if (!this.editor.canvas.contains(event.target)) return;
      event.preventDefault();
      event.stopPropagation();
      const at = { x: event.clientX, y: event.clientY };
      const groupTitle = event.target.closest(".sse-group-title");
      const nodeEl = event.target.closest(".drawflow-node");
      const link = event.target.closest(".connection .main-path");
      let items = null;
      if (groupTitle && this.editor.groups) items = this.editor.groups.menu(groupTitle.parentElement, at);
      else if (link) items = this.linkMenu(link);
      else if (nodeEl) items = this.nodeMenu(nodeEl.id.slice(5));
      else if (this.editor.onBackground(event.target)) items = this.canvasMenu(at);
      if (items) this.open(at, items);
    }

    // ------------------------------------------------------------------ what they hold
    canvasMenu(at) {
      const editor = this.editor;
      const point = editor.toCanvas(at.x, at.y);
      const selected = editor.selection.selected();
      const add = CATEGORIES.map(([category, title]) => ({
        label: title, items: Object.values(editor.types).filter((t) => t.category === category).map((spec) => ({
          label: spec.title, type: spec.name,
          run: () => { const id = editor.addNode(spec.name, point.x, point.y); editor.syncFields(id); editor.selection.set([String(id)]); },
        })),
      }));
      return [
        { label: "Search nodes…", hint: "double-click", run: () => editor.search.open(at) },
        { label: "Add node", items: add },
        { label: "Add group here", run: () => editor.groups.add(point) },
        selected.length ? { label: `Group ${selected.length} selected node${selected.length === 1 ? "" : "s"}`, hint: "Ctrl+G",
                            run: () => editor.groups.around(selected) } : null,
        { label: "Paste", hint: "Ctrl+V", run: () => editor.clipboard.paste(editor.clipboard.stored(), point) },
        { label: "Select all", hint: "Ctrl+A", run: () => editor.selection.selectAll() },
        { label: "Fit view", run: () => editor.fit() },
      ].filter(Boolean);
    }

    nodeMenu(id) {
      const editor = this.editor;
      if (!editor.selection.selected().includes(id)) editor.selection.set([id]);
      const ids = editor.selection.selected();
      const many = ids.length > 1 ? ` ${ids.length} nodes` : "";
      const swatches = editor.colors.swatches.map(([name, color]) => ({
        label: name, color, run: () => editor.colors.paint(ids, color),
      })).concat([{ label: "No colour", run: () => editor.colors.paint(ids, null) }]);
      return [
        { label: "Duplicate" + many, hint: "Ctrl+D", run: () => editor.clipboard.duplicate() },
        { label: "Copy" + many, hint: "Ctrl+C", run: () => editor.clipboard.copy() },
        { label: "Delete" + many, hint: "Del", run: () => editor.selection.remove() },
        { label: (editor.bypass.turnsOn(ids) ? "Bypass" : "Stop bypassing") + many, hint: "Ctrl+B",
          run: () => editor.bypass.toggle(ids) },
        { label: "Colour", items: swatches },
        { label: "Group" + (many || " this node"), hint: "Ctrl+G", run: () => editor.groups.around(ids) },
      ];
    }

    linkMenu(path) {
      const df = this.editor.df;
      return [{ label: "Delete link", hint: "click, Del", run: () => {
        if (df.connection_selected) df.connection_selected.classList.remove("selected");
        df.connection_selected = path; // what drawflow's own removeConnection() removes
        df.removeConnection();
      } }];
    }

    // ------------------------------------------------------------------ drawing
    open(at, items) {
      this.close();
      this.menu = this.list(items);
      this.menu.classList.add("sse-menu-root");
      this.editor.root.appendChild(this.menu);
      const left = Math.max(4, Math.min(at.x, window.innerWidth - this.menu.offsetWidth - 4));
      const top = Math.max(4, Math.min(at.y, window.innerHeight - this.menu.offsetHeight - 4));
      Object.assign(this.menu.style, { left: left + "px", top: top + "px" });
    }

    list(items) {
      const menu = this.h("div", { class: "sse-menu", role: "menu" });
      for (const item of items) {
        const row = this.h("div", { class: "sse-menu-item" + (item.items ? " sse-menu-parent" : ""), role: "menuitem",
                                    "data-label": item.label, "data-node-type": item.type }, [
          item.color ? this.h("span", { class: "sse-swatch", style: `background:${item.color}` }) : null,
          this.h("span", { class: "sse-menu-label", text: item.label }),
          item.hint ? this.h("span", { class: "sse-menu-hint", text: item.hint }) : null,
          item.items ? this.h("span", { class: "sse-menu-hint", text: "▸" }) : null,
        ]);
        if (item.items) {
          const open = () => {
            for (const other of menu.querySelectorAll(":scope > .sse-menu-item > .sse-menu")) other.remove();
            const sub = this.list(item.items);
            sub.classList.add("sse-submenu");
            row.appendChild(sub);
          };
          row.addEventListener("mouseenter", open);
          row.addEventListener("click", (e) => { if (e.target === row || e.target.parentElement === row) open(); });
        } else {
          row.addEventListener("click", (e) => { e.stopPropagation(); this.close(); item.run(); });
        }
        menu.appendChild(row);
      }
      return menu;
    }

    close() {
      if (!this.menu) return;
      this.menu.remove();
      this.menu = null;
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.menus = new Menus(editor, kit);
  });
})();
