/* The workflow and the editor (methods of NodeEditor, studio/page/web/node_editor.js): the graph
 * written as workflow JSON and read back, the component's value kept equal to it, and undo/redo
 * (one entry per edit, pictures named by number).
 */
(function () {
  "use strict";

  const { STORAGE_KEY, PICTURE_KINDS } = window.StepStudioEditorKit;
  const UNDO_LIMIT = 100;

  class EditorWorkflow {
    toWorkflow() {
      const data = this.df.drawflow.drawflow.Home.data;
      const nodes = [], links = [];
      for (const node of Object.values(data)) {
        const spec = this.types[node.name];
        const values = {};
        for (const field of spec.fields) values[field.name] = node.data[field.name];
        nodes.push({ id: String(node.id), type: node.name, values, position: [Math.round(node.pos_x), Math.round(node.pos_y)] });
        spec.outputs.forEach((port, i) => {
          for (const conn of (node.outputs["output_" + (i + 1)] || { connections: [] }).connections) {
            const target = data[conn.node];
            const index = parseInt(conn.output.split("_")[1], 10) - 1;
            links.push({ from: { node: String(node.id), port: port.name },
                         to: { node: String(conn.node), port: this.types[target.name].inputs[index].name } });
          }
        });
      }
      const workflow = { version: 1, nodes, links };
      this.emit("saving", workflow); // the parts add what they keep (groups, node colours)
      return workflow;
    }

    load(workflow, message) {
      if (!workflow || !Array.isArray(workflow.nodes)) { this.say("That is not a workflow (it has no nodes list).", "error"); return false; }
      this.clearStaleProblems();
      this.quiet++;
      try {
        this.df.clear();
        const ids = {};
        const unknown = [];
        for (const node of workflow.nodes) {
          if (!this.types[node.type]) { unknown.push(node.type); continue; }
          const pos = node.position || [0, 0];
          ids[String(node.id)] = this.addNode(node.type, pos[0], pos[1], node.values || {});
        }
        const cycles = [];
        for (const link of workflow.links || []) {
          const from = ids[String(link.from.node)], to = ids[String(link.to.node)];
          if (from === undefined || to === undefined) continue;
          if (String(from) === String(to) || this.reaches(to, from)) {  // as a drawn link would be, refused
            cycles.push(`${this.fileName(workflow, link.from.node)} -> ${this.fileName(workflow, link.to.node)}`);
            continue;
          }
          const out = this.types[this.nodeData(from).name].outputs.findIndex((p) => p.name === link.from.port);
          const inp = this.types[this.nodeData(to).name].inputs.findIndex((p) => p.name === link.to.port);
          if (out >= 0 && inp >= 0) this.df.addConnection(from, to, "output_" + (out + 1), "input_" + (inp + 1));
        }
        for (const id of Object.values(ids)) this.syncFields(id);
        this.emit("loaded", workflow, ids);
        if (unknown.length) this.say("Skipped unknown node types: " + unknown.join(", "), "error");
        else if (cycles.length) this.say("Skipped links that would make a cycle: " + cycles.join("; ") + ".", "error");
        else if (message) this.say(message);
      } finally {
        this.quiet--;
      }
      this.changed();
      return true;
    }

    fileName(workflow, fileId) {
      // A node of a loaded file as the user knows it: its title and its id in that file ("Sampler (node 2)").
      const node = workflow.nodes.find((n) => String(n.id) === String(fileId));
      return `${this.types[node.type].title} (node ${fileId})`;
    }

    syncFields(id) {
      // drawflow fills df-* controls from node data; selects need their value set explicitly.
      const node = this.nodeData(id);
      const el = this.nodeElement(id);
      for (const [name, value] of Object.entries(node.data)) {
        const control = el.querySelector(`[df-${name}]`);
        if (control && control.value !== String(value)) control.value = value;
      }
      for (const box of el.querySelectorAll(".sse-picture")) this.showPicture(id, box.dataset.field);
      for (const { port, index } of this.typedOutputs(node.name)) {
        this.markPort(el.querySelector(`.outputs .output_${index + 1}`), port.name, node.data[port.typed_by]);
      }
    }

    changed() {
      // One edit can fire several drawflow events (deleting a node first removes its links):
      // they become one undo entry, committed once the current event is handled.
      if (this.quiet || this.commitPending) return;
      this.commitPending = true;
      queueMicrotask(() => { this.commitPending = false; this.commit(); });
    }

    commit() {
      if (this.quiet) return;
      const workflow = this.toWorkflow();
      const json = JSON.stringify(workflow);
      const entry = this.withoutPictures(workflow);
      if (this.undoStack[this.undoStack.length - 1] !== entry) {
        this.undoStack.push(entry);
        if (this.undoStack.length > UNDO_LIMIT) this.undoStack.shift();
        if (!this.restoring) this.redoStack = []; // a new edit: what was undone can't come back
      }
      this.restoring = false;
      this.lastCommitted = json;
      this.props.value = json; // keeps the component's value (what Run sends) equal to the graph
      try { localStorage.setItem(STORAGE_KEY, json); } catch (e) { /* storage full or disabled */ }
      this.root.dataset.nodes = String(Object.keys(this.df.drawflow.drawflow.Home.data).length);
      this.emit("committed", workflow);
    }

    changedSoon() {
      clearTimeout(this.typingTimer);
      this.typingTimer = setTimeout(() => this.changed(), 250);
    }

    undo() {
      if (this.undoStack.length < 2) { this.say("Nothing to undo."); return; }
      this.redoStack.push(this.undoStack.pop());
      this.restore(this.undoStack.pop(), "Undone.");
    }

    redo() {
      if (!this.redoStack.length) { this.say("Nothing to redo."); return; }
      this.restore(this.redoStack.pop(), "Redone.");
    }

    restore(entry, message) {
      // The reload commits the entry again (with the editor's new node ids), keeping the redo stack.
      this.restoring = true;
      this.load(this.withPictures(JSON.parse(entry)), message);
    }

    // Undo entries name each picture by a number instead of holding its data URL (a hundred
    // entries of a large picture would hold it a hundred times).
    withoutPictures(workflow) {
      this.pictures = this.pictures || new Map(); // data URL -> number
      this.pictureUrls = this.pictureUrls || [];
      const nodes = workflow.nodes.map((node) => {
        const values = { ...node.values };
        for (const field of this.types[node.type].fields) {
          const url = values[field.name];
          if (!PICTURE_KINDS.includes(field.kind) || typeof url !== "string" || !url.startsWith("data:")) continue;
          if (!this.pictures.has(url)) { this.pictures.set(url, this.pictureUrls.length); this.pictureUrls.push(url); }
          values[field.name] = { picture: this.pictures.get(url) };
        }
        return { ...node, values };
      });
      return JSON.stringify({ ...workflow, nodes });
    }

    withPictures(workflow) {
      for (const node of workflow.nodes) for (const [name, value] of Object.entries(node.values || {})) {
        if (value && typeof value === "object" && "picture" in value) node.values[name] = this.pictureUrls[value.picture];
      }
      return workflow;
    }
  }

  (window.StepStudioEditorMethods = window.StepStudioEditorMethods || []).push(EditorWorkflow);
})();
