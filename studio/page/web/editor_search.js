/* The node search (a part of studio/page/web/node_editor.js): double-click on empty canvas, type,
 * Enter; the node is added where you clicked.
 *
 * Words match a node's title, name or category, or the type of one of its ports ("seed" finds every
 * node with a seed port); "in:TYPE" and "out:TYPE" look at inputs or outputs only. Opened by a link
 * dropped on empty canvas (editor_link_drop.js) it lists only the nodes that fit the link, and the
 * new node is linked to it. Up/Down choose, Enter adds, Escape closes.
 */
(function () {
  "use strict";

  const CATEGORY_ORDER = ["values", "fan-out", "pictures", "sampler", "outputs"];
  const MAX_SHOWN = 30;

  const words = (text) => String(text || "").toLowerCase().replace(/_/g, " ");

  class NodeSearch {
    constructor(editor, kit) {
      this.editor = editor;
      this.h = kit.h;
      editor.canvas.addEventListener("dblclick", (e) => {
        if (!editor.onBackground(e.target)) return;
        e.preventDefault();
        this.open({ x: e.clientX, y: e.clientY });
      });
      document.addEventListener("mousedown", (e) => {
        if (this.box && !this.box.contains(e.target)) this.close();
      }, true);
    }

    // ------------------------------------------------------------------ what can be added
    // An entry: a node type, and for a link being made, which of its ports takes it (and, for a
    // Sweep, the setting that makes its output fit).
    entries(link) {
      const types = Object.values(this.editor.types)
        .sort((a, b) => CATEGORY_ORDER.indexOf(a.category) - CATEGORY_ORDER.indexOf(b.category));
      const entries = [];
      for (const spec of types) {
        if (!link) { entries.push({ spec }); continue; }
        if (link.from === "output") {
          const input = spec.inputs.findIndex((p) => (p.accepts || [p.type]).includes(link.type));
          if (input >= 0) entries.push({ spec, input });
          continue;
        }
        spec.outputs.forEach((port, output) => {
          if (!port.typed_by) {
            if (link.accepts.includes(port.type)) entries.push({ spec, output });
            return;
          }
          const field = spec.fields.find((f) => f.name === port.typed_by);
          for (const choice of field.choices) {
            if (link.accepts.includes(choice)) entries.push({ spec, output, values: { [field.name]: choice }, note: choice });
          }
        });
      }
      return entries;
    }

    matches(entry, query) {
      // Each word must match; a lower score is a better match (title first, then ports).
      let score = 0;
      const spec = entry.spec;
      const title = words(spec.title) + (entry.note ? " " + words(entry.note) : "");
      const inputs = spec.inputs.map((p) => words(p.type) + " " + words(p.name));
      const outputs = spec.outputs.map((p) => words(p.type || entry.note || "values"));
      for (const token of words(query).split(/\s+/).filter(Boolean)) {
        if (token.startsWith("in:") || token.startsWith("out:")) {
          const [side, type] = token.split(":");
          if (!(side === "in" ? inputs : outputs).some((text) => text.includes(type))) return null;
          score += 3;
        } else if (title.startsWith(token)) score += 0;
        else if (title.includes(token)) score += 1;
        else if (words(spec.name).includes(token) || words(spec.category).includes(token)) score += 2;
        else if (inputs.concat(outputs).some((text) => text.includes(token))) score += 3;
        else return null;
      }
      return score;
    }

    // ------------------------------------------------------------------ the box
    // `onEnd`: called once the box closes, whether a node was added (after it is) or not.
    open({ x, y, link, onEnd }) {
      this.close();
      this.at = { x, y };
      this.link = link || null;
      this.onEnd = onEnd || null;
      this.input = this.h("input", { type: "text", class: "sse-search-input", placeholder: "Search nodes: name or port type",
                                     spellcheck: "false", autocomplete: "off" });
      this.list = this.h("div", { class: "sse-search-list", role: "listbox" });
      const head = link ? (link.from === "output" ? `Nodes that take ${link.type}` : `Nodes that make ${link.accepts.join(" or ")}`)
        : "Add a node";
      this.box = this.h("div", { class: "sse-search", role: "dialog" }, [
        this.h("div", { class: "sse-search-head", text: head }), this.input, this.list,
        this.h("div", { class: "sse-search-hint", text: "↑↓ choose · Enter adds · Esc closes · in:TYPE / out:TYPE filter by port" }),
      ]);
      this.editor.root.appendChild(this.box);
      const left = Math.max(4, Math.min(x, window.innerWidth - this.box.offsetWidth - 4));
      const top = Math.max(4, Math.min(y, window.innerHeight - this.box.offsetHeight - 4));
      Object.assign(this.box.style, { left: left + "px", top: top + "px" });
      this.input.addEventListener("input", () => this.refresh());
      this.input.addEventListener("keydown", (e) => this.onKey(e));
      this.refresh();
      this.input.focus();
    }

    close() {
      if (!this.box) return;
      this.box.remove();
      this.box = null;
      const ended = this.onEnd;
      this.onEnd = null;
      if (ended) ended();
    }

    refresh() {
      const query = this.input.value;
      this.shown = this.entries(this.link)
        .map((entry, order) => ({ entry, order, score: this.matches(entry, query) }))
        .filter((m) => m.score !== null)
        .sort((a, b) => a.score - b.score || a.order - b.order)
        .slice(0, MAX_SHOWN)
        .map((m) => m.entry);
      this.active = 0;
      this.list.innerHTML = "";
      this.shown.forEach((entry, index) => {
        const spec = entry.spec;
        const ports = `${spec.inputs.length ? "in: " + spec.inputs.map((p) => p.type).join(", ") : ""}` +
                      `${spec.inputs.length && spec.outputs.length ? " · " : ""}` +
                      `${spec.outputs.length ? "out: " + spec.outputs.map((p) => p.type || entry.note || "a setting").join(", ") : ""}`;
        const row = this.h("div", { class: "sse-search-item sse-cat-" + spec.category, role: "option", "data-node-type": spec.name,
                                    title: spec.description }, [
          this.h("span", { class: "sse-search-title", text: spec.title + (entry.note ? ` (${entry.note.replace(/_/g, " ")})` : "") }),
          this.h("span", { class: "sse-search-ports", text: ports }),
        ]);
        row.addEventListener("mousedown", (e) => { e.preventDefault(); this.pick(index); });
        this.list.appendChild(row);
      });
      if (!this.shown.length) this.list.appendChild(this.h("div", { class: "sse-search-none", text: "No node matches." }));
      this.highlight();
    }

    highlight() {
      [...this.list.querySelectorAll(".sse-search-item")].forEach((row, index) => {
        row.classList.toggle("sse-active", index === this.active);
        if (index === this.active) row.scrollIntoView({ block: "nearest" });
      });
    }

    onKey(event) {
      event.stopPropagation(); // the editor's shortcuts don't see keys typed here
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        const count = this.shown.length;
        if (count) this.active = (this.active + (event.key === "ArrowDown" ? 1 : count - 1)) % count;
        this.highlight();
      } else if (event.key === "Enter") {
        event.preventDefault();
        if (this.shown.length) this.pick(this.active);
      } else if (event.key === "Escape") {
        event.preventDefault();
        this.close();
      }
    }

    // ------------------------------------------------------------------ adding
    pick(index) {
      const entry = this.shown[index], link = this.link, at = this.at, ended = this.onEnd;
      this.onEnd = null;
      this.close();
      if (entry) this.add(entry, at, link);
      if (ended) ended();
    }

    add(entry, at, link) {
      // The node's top-left at the click; for a link, the port it links by lands near the drop point.
      const editor = this.editor, spec = entry.spec;
      const point = editor.toCanvas(at.x, at.y);
      const width = spec.category === "sampler" ? 250 : 210;
      let x = link && link.from === "input" ? point.x - width - 20 : point.x;
      const y = link ? point.y - 40 : point.y;
      if (editor.minimap) x = Math.max(x, editor.minimap.visible().x + 10); // not off the canvas's left edge
      const id = editor.addNode(spec.name, x, y, entry.values || {});
      editor.syncFields(id); // selects, and a Sweep's output typed by its setting
      if (link && link.from === "output") {
        editor.df.addConnection(link.node, id, "output_" + (link.index + 1), "input_" + (entry.input + 1));
      } else if (link) {
        editor.df.addConnection(id, link.node, "output_" + (entry.output + 1), "input_" + (link.index + 1));
      }
      if (editor.selection) editor.selection.set([String(id)]);
      editor.say(`Added ${spec.title}${link ? ", linked" : ""}.`);
      return id;
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.search = new NodeSearch(editor, kit);
  });
})();
