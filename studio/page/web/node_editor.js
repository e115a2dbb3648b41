/* stepstudio's node editor: a drawflow canvas inside the studio's gr.HTML component.
 *
 * The node types (ports, types, fields) come from Python (`props.node_types`), so the palette,
 * the typed-port checks and the compiler agree. The editor keeps the component's value equal to
 * the workflow JSON (version 1, see studio/workflows/format.py); Run fires the component's `submit`
 * event and Python streams the run back through the `run_state` prop (each picture once: see
 * mergeRun).
 *
 * Mounted from js_on_load:  StepStudioEditor.mount(element, props, trigger, watch)
 *
 * This file holds the editor's core: the page it builds, drawflow, nodes, ports and links. Its other
 * methods are written by concern in their own files, each a class of methods pushed to
 * window.StepStudioEditorMethods and joined to NodeEditor here: editor_pictures.js (pictures on
 * nodes, the mask painter), editor_workflow.js (workflow JSON in and out, undo), editor_toolbar.js
 * (the toolbar's actions) and editor_run_view.js (the run drawn on the nodes). What they share is in
 * editor_kit.js. All of them load before this file (EDITOR_FILES in studio/page/workflow_tab.py).
 *
 * The gestures (search, menus, selection, clipboard, groups, minimap, shortcuts) live in their own
 * editor_*.js files: each registers a part in window.StepStudioEditorParts, attached to the editor
 * before its first workflow loads, and talks to it through on()/emit() (events: "saving" with the
 * workflow being written, "loaded" with the workflow and its new node ids, "inserted" with one
 * pasted node's JSON and its new id, "committed", "view").
 */
(function () {
  "use strict";

  const { h, escapeHtml, STORAGE_KEY, PICTURE_KINDS } = window.StepStudioEditorKit;

  class NodeEditor {
    constructor(element, props, trigger, watch) {
      this.root = element.querySelector(".sse-root") || element;
      this.props = props;
      this.trigger = trigger;
      this.types = {};
      for (const spec of props.node_types || []) this.types[spec.name] = spec;
      this.examples = props.examples || {};
      this.schedulers = props.schedulers || [];
      this.models = props.models || [];
      this.loras = props.loras || [];
      this.undoStack = [];
      this.redoStack = [];
      this.hooks = {};
      this.quiet = 0; // > 0 while loading a workflow: no undo entries, no link checks
      this.runState = null;
      this.watch = watch;
      this.build();
      this.startDrawflow();
    }

    // The first workflow loads once the parts are attached (they keep what it holds for them).
    start() {
      const props = this.props, watch = this.watch;
      const saved = this.readStorage(STORAGE_KEY);
      this.load(saved || this.parse(props.value) || this.examples[props.default_example] || { version: 1, nodes: [], links: [] });
      watch("run_state", () => this.showRun(this.props.run_state));
      // Python sends a workflow to open (History: "Open its workflow"); the editor's own
      // edits come back here too, and are recognised by being the graph already shown.
      watch("value", () => {
        if (this.props.value !== this.lastCommitted) {
          const workflow = this.parse(this.props.value);
          if (workflow) this.load(workflow, "Opened a workflow.");
        }
      });
    }

    on(name, handler) {
      (this.hooks[name] = this.hooks[name] || []).push(handler);
    }

    emit(name, ...args) {
      for (const handler of this.hooks[name] || []) handler(...args);
    }

    // ------------------------------------------------------------------ page structure
    // The canvas is the whole editor; what floats over it (the HUD) are the toolbar along its top
    // (editor_toolbar.js), the node palette down its left side, and the message and the run bar
    // along its bottom. Only those panels take the mouse; between them the canvas shows through.
    build() {
      this.root.innerHTML = "";
      this.toolbar = this.buildToolbar();
      this.palette = h("div", { class: "sse-palette" });
      this.canvas = h("div", { class: "sse-canvas", ondragover: (e) => e.preventDefault(), ondrop: (e) => this.onDrop(e) });
      this.message = h("div", { class: "sse-message", role: "status" });
      this.runbar = h("div", { class: "sse-runbar" }, [h("span", { class: "sse-run-text", text: "Ready." }),
                                                      h("progress", { class: "sse-run-progress", value: 0, max: 1 })]);
      this.hud = h("div", { class: "sse-hud" }, [this.toolbar, this.palette,
                                                 h("div", { class: "sse-status" }, [this.message, this.runbar])]);
      this.root.appendChild(h("div", { class: "sse-body" }, [this.canvas, this.hud, this.helpPanel]));
      this.buildPalette();
      this.refreshLoadChoices();
    }

    buildPalette() {
      const categories = ["values", "fan-out", "pictures", "sampler", "outputs"];
      const titles = { values: "Values", "fan-out": "Fan-out", pictures: "Pictures", sampler: "Sampler", outputs: "Outputs" };
      const fold = h("button", { class: "sse-palette-fold", type: "button", text: "Nodes ‹", title: "Hide the node list",
                                 onclick: () => {
                                   const folded = this.palette.classList.toggle("sse-folded");
                                   fold.textContent = folded ? "Nodes ›" : "Nodes ‹";
                                   fold.title = folded ? "Show the node list" : "Hide the node list";
                                 } });
      this.palette.appendChild(fold);
      for (const category of categories) {
        this.palette.appendChild(h("div", { class: "sse-palette-head", text: titles[category] }));
        for (const spec of Object.values(this.types).filter((t) => t.category === category)) {
          this.palette.appendChild(h("div", {
            class: "sse-palette-item sse-cat-" + category, draggable: "true", "data-node-type": spec.name,
            title: spec.description + " (drag onto the canvas, or click)", text: spec.title,
            ondragstart: (e) => e.dataTransfer.setData("text/plain", spec.name),
            onclick: () => this.addNodeAtView(spec.name),
          }));
        }
      }
    }

    startDrawflow() {
      const df = new Drawflow(this.canvas);
      df.reroute = false;
      df.curvature = 0.4;
      df.zoom_min = 0.3;
      df.zoom_max = 2.0;
      df.start();
      // drawflow knows a press on its container (to pan) by the container's *first* class; with
      // "sse-canvas" first, the area a pan uncovers would never pan again: no pan without limit.
      this.canvas.className = "parent-drawflow sse-canvas";
      this.df = df;
      df.on("connectionCreated", (c) => this.onConnection(c));
      // drawflow drops a link from a node onto its own input without a word: note it, then say why.
      this.canvas.addEventListener("mouseup", (event) => this.noteSelfLink(event), true);
      df.on("connectionCancel", () => this.onConnectionCancel());
      df.on("connectionRemoved", () => this.changed());
      df.on("nodeRemoved", () => this.changed());
      df.on("nodeMoved", () => this.changed());
      // drawflow 0.0.60 writes a dragged node's position from offsetLeft/Top read again after it
      // moved the node: its data runs one mouse step ahead of the drawn node (saved, the node
      // jumps on reload; a selection moving with it drifts). Where the node is drawn is the truth.
      df.on("mouseMove", () => {
        const node = df.drag && df.ele_selected && df.drawflow.drawflow.Home.data[df.ele_selected.id.slice(5)];
        if (node) Object.assign(node, { pos_x: parseFloat(df.ele_selected.style.left), pos_y: parseFloat(df.ele_selected.style.top) });
      });
      df.on("nodeDataChanged", (id) => this.onNodeData(id));
    }

    // ------------------------------------------------------------------ nodes
    nodeHtml(spec) {
      const rows = Math.max(spec.inputs.length, spec.outputs.length);
      let ports = "";
      for (let i = 0; i < rows; i++) {
        const input = spec.inputs[i], output = spec.outputs[i];
        ports += `<div class="sse-port-row"><span class="sse-in">${input ? escapeHtml(input.name.replace("_", " ")) + (input.required ? " *" : "") : ""}</span>` +
                 `<span class="sse-out">${output ? escapeHtml((output.type || "values").replace("_", " ")) : ""}</span></div>`;
      }
      let fields = "";
      for (const field of spec.fields) {
        const id = "df-" + field.name;
        let control;
        if (PICTURE_KINDS.includes(field.kind)) {
          // Not a df- control: the picture is set by the handlers in wirePicture.
          const button = field.kind === "mask" ? "Paint…" : "Choose…";
          control = `<div class="sse-picture" data-field="${escapeHtml(field.name)}" data-kind="${field.kind}">` +
                    `<img class="sse-picture-img" alt="${escapeHtml(field.label)}"><span class="sse-picture-empty">` +
                    `${field.kind === "mask" ? "not painted" : "drop a picture here"}</span>` +
                    `<button class="sse-btn sse-picture-pick" type="button">${button}</button></div>`;
        } else if (field.kind === "lines") control = `<textarea ${id} rows="3" spellcheck="false"></textarea>`;
        else if (field.kind === "choice" || field.kind === "scheduler" || field.kind === "model" || field.kind === "lora") {
          const choices = field.kind === "scheduler" ? [""].concat(this.schedulers)
            : field.kind === "model" ? [""].concat(this.models)
            : field.kind === "lora" ? [""].concat(this.loras) : field.choices;
          const empty = field.kind === "model" ? "default model" : field.kind === "lora" ? "choose an adapter" : "model default";
          control = `<select ${id}>` + choices.map((c) => `<option value="${escapeHtml(c)}">${escapeHtml(c || empty)}</option>`).join("") + "</select>";
        } else {
          const type = field.kind === "text" ? "text" : "number";
          const step = field.kind === "float" ? ` step="${field.step || 0.5}"` : "";
          control = `<input type="${type}" ${id}${step}>`;
        }
        fields += `<label class="sse-field" title="${escapeHtml(field.help || "")}"><span>${escapeHtml(field.label)}</span>${control}</label>`;
      }
      return `<div class="sse-node" data-node-type="${spec.name}">` +
             `<div class="sse-title"><span class="sse-title-text">${escapeHtml(spec.title)}</span>` +
             `<span class="sse-badge"></span><span class="sse-delete" title="Delete this node">×</span></div>` +
             `<div class="sse-ports">${ports}</div><div class="sse-fields">${fields}</div>` +
             `<div class="sse-problems"></div><div class="sse-live"></div></div>`;
    }

    addNode(typeName, x, y, values) {
      const spec = this.types[typeName];
      if (!spec) return null;
      const data = {};
      for (const field of spec.fields) data[field.name] = values && field.name in values ? values[field.name] : field.default;
      const id = this.df.addNode(typeName, spec.inputs.length, spec.outputs.length, x, y, "sse-df-node sse-cat-" + spec.category,
                                 data, this.nodeHtml(spec));
      const el = this.nodeElement(id);
      el.dataset.nodeType = typeName;
      el.querySelector(".sse-delete").addEventListener("mousedown", (e) => { e.stopPropagation(); });
      el.querySelector(".sse-delete").addEventListener("click", (e) => { e.stopPropagation(); this.df.removeNodeId("node-" + id); });
      spec.inputs.forEach((port, i) => this.markPort(el.querySelector(".inputs .input_" + (i + 1)), port.name, port.type));
      spec.outputs.forEach((port, i) => this.markPort(el.querySelector(".outputs .output_" + (i + 1)), port.name, this.outputType(id, i)));
      for (const box of el.querySelectorAll(".sse-picture")) this.wirePicture(id, box);
      this.changed();
      return id;
    }

    markPort(portEl, name, type) {
      if (!portEl) return;
      portEl.dataset.port = name;
      portEl.dataset.portType = type || "";
      portEl.title = name + (type ? " (" + type + ")" : "");
      portEl.className = portEl.className.replace(/\bsse-t-\S+/g, "").trim() + " sse-t-" + (type || "none");
    }

    nodeElement(id) {
      return this.canvas.querySelector("#node-" + id);
    }

    nodeData(id) {
      return this.df.getNodeFromId(id);
    }

    outputType(id, index) {
      const node = this.nodeData(id);
      const port = this.types[node.name].outputs[index];
      if (port.type) return port.type;
      return node.data[port.typed_by]; // e.g. a Sweep's output is the setting it varies
    }

    inputType(id, index) {
      const node = this.nodeData(id);
      return this.types[node.name].inputs[index].type;
    }

    accepts(id, index, outputType) {
      // An input takes its own type, and a picture input a sampler's images too (stages).
      const port = this.types[this.nodeData(id).name].inputs[index];
      return (port.accepts || [port.type]).includes(outputType);
    }

    addNodeAtView(typeName) {
      // Near the top-left of the canvas's free part, shifted a little per node so they don't stack.
      const rect = this.freeArea();
      const count = Object.keys(this.df.drawflow.drawflow.Home.data).length;
      const point = this.toCanvas(rect.left + 40 + (count % 6) * 24, rect.top + 30 + (count % 6) * 24);
      return this.addNode(typeName, point.x, point.y);
    }

    // The part of the canvas that no panel covers, in the window: drawflow's own canvas (the
    // precanvas) is laid out there (editor_gestures.css), so the view's origin is its top-left.
    freeArea() {
      const box = this.canvas.getBoundingClientRect(), pre = this.df.precanvas;
      const left = box.left + pre.offsetLeft, top = box.top + pre.offsetTop;
      return { left, top, width: pre.clientWidth, height: pre.clientHeight, right: left + pre.clientWidth, bottom: top + pre.clientHeight };
    }

    // A node placed by code (a selection or a group moving with the node being dragged).
    moveNodeTo(id, x, y) {
      const node = this.df.drawflow.drawflow.Home.data[id], el = this.nodeElement(id);
      if (!node || !el) return;
      Object.assign(node, { pos_x: x, pos_y: y });
      Object.assign(el.style, { left: x + "px", top: y + "px" });
      this.df.updateConnectionNodes("node-" + id);
    }

    // Whether a pointer event landed on the canvas itself: no node, port or link under it.
    onBackground(target) {
      return target === this.canvas || target === this.df.precanvas;
    }

    toCanvas(clientX, clientY) {
      const pre = this.df.precanvas;
      const scale = pre.clientWidth / (pre.clientWidth * this.df.zoom);
      const box = pre.getBoundingClientRect();
      return { x: clientX * scale - box.x * scale, y: clientY * scale - box.y * scale };
    }

    onDrop(event) {
      event.preventDefault();
      const file = event.dataTransfer.files && event.dataTransfer.files[0];
      if (file) return this.onUpload(file, this.toCanvas(event.clientX, event.clientY)); // a workflow, or a picture
      const typeName = event.dataTransfer.getData("text/plain");
      if (!this.types[typeName]) return;
      const point = this.toCanvas(event.clientX, event.clientY);
      this.addNode(typeName, point.x, point.y);
    }

    // ------------------------------------------------------------------ links
    onConnection(c) {
      if (this.quiet) return;
      const out = parseInt(c.output_class.split("_")[1], 10) - 1;
      const inp = parseInt(c.input_class.split("_")[1], 10) - 1;
      const have = this.outputType(c.output_id, out), want = this.inputType(c.input_id, inp);
      const inputNode = this.nodeData(c.input_id);
      const existing = inputNode.inputs[c.input_class].connections;
      let refusal = null;
      if (!this.accepts(c.input_id, inp, have)) refusal = `Can't link ${have || "?"} to ${want}: the port types differ.`;
      else if (existing.length > 1) refusal = `This ${want} input already has a link; an input takes one (delete the old link first).`;
      else if (String(c.output_id) === String(c.input_id) || this.reaches(c.input_id, c.output_id)) refusal = "That link would make a cycle.";
      if (refusal) {
        this.quiet++;
        this.df.removeSingleConnection(c.output_id, c.input_id, c.output_class, c.input_class);
        this.quiet--;
        this.say(refusal, "error");
        this.flashPort(c.input_id, c.input_class);
        return;
      }
      this.say("");
      this.changed();
    }

    noteSelfLink(event) {
      // Runs before drawflow's own mouseup (capture phase), while its dragged link is still known.
      const port = event.target.closest && event.target.closest(".input");
      const from = this.df.connection && this.df.ele_selected && this.df.ele_selected.closest(".drawflow-node");
      this.selfLink = port && from && port.closest(".drawflow-node") === from ? port : null;
    }

    onConnectionCancel() {
      const port = this.selfLink;
      this.selfLink = null;
      if (!port) return;
      const node = port.closest(".drawflow-node");
      this.say(`That link would make a cycle: a ${this.types[node.dataset.nodeType].title}'s output can't feed its own input.`, "error");
      this.flashPort(node.id.slice(5), port.classList[1]);
    }

    reaches(fromId, toId) {
      // Is toId downstream of fromId?
      const data = this.df.drawflow.drawflow.Home.data;
      const seen = new Set();
      const stack = [String(fromId)];
      while (stack.length) {
        const id = stack.pop();
        if (id === String(toId)) return true;
        if (seen.has(id) || !data[id]) continue;
        seen.add(id);
        for (const output of Object.values(data[id].outputs)) for (const conn of output.connections) stack.push(String(conn.node));
      }
      return false;
    }

    flashPort(nodeId, portClass) {
      const el = this.nodeElement(nodeId);
      const port = el && el.querySelector(".inputs ." + portClass);
      if (!port) return;
      port.classList.add("sse-refused");
      setTimeout(() => port.classList.remove("sse-refused"), 900);
    }

    onNodeData(id) {
      const node = this.nodeData(id);
      if (node && this.typedOutputs(node.name).length) this.retypeOutputs(id);
      this.changedSoon();
    }

    typedOutputs(typeName) {
      // The output ports whose type is a field's value (a Sweep's follows its setting).
      return this.types[typeName].outputs.map((port, index) => ({ port, index })).filter((o) => o.port.typed_by);
    }

    retypeOutputs(id) {
      // A typed output follows its field; links that no longer fit go.
      const el = this.nodeElement(id);
      const node = this.nodeData(id);
      for (const { port, index } of this.typedOutputs(node.name)) {
        const key = `output_${index + 1}`;
        const type = this.outputType(id, index);
        this.markPort(el.querySelector(`.outputs .${key}`), port.name, type);
        for (const conn of [...node.outputs[key].connections]) {
          const inp = parseInt(conn.output.split("_")[1], 10) - 1;
          if (!this.accepts(conn.node, inp, type)) {
            this.df.removeSingleConnection(id, conn.node, key, conn.output);
            this.say(`Removed a link that no longer fits: the ${this.types[node.name].title.toLowerCase()} now makes ${type}.`, "error");
          }
        }
      }
    }

    // ------------------------------------------------------------------ helpers
    say(text, kind) {
      this.message.textContent = text || "";
      this.message.dataset.kind = kind || "info";
    }

    parse(text) {
      if (!text) return null;
      if (typeof text === "object") return text;
      try { return JSON.parse(text); } catch (e) { return null; }
    }

    readStorage(key) {
      try { return this.parse(localStorage.getItem(key)); } catch (e) { return null; }
    }
  }

  // The methods the other editor_*.js files write, by concern (they are loaded before this one).
  for (const methods of window.StepStudioEditorMethods || []) {
    for (const name of Object.getOwnPropertyNames(methods.prototype)) {
      if (name === "constructor") continue;
      if (name in NodeEditor.prototype) throw new Error(`NodeEditor.${name} is written twice (${methods.name})`);
      Object.defineProperty(NodeEditor.prototype, name, Object.getOwnPropertyDescriptor(methods.prototype, name));
    }
  }

  window.StepStudioEditor = {
    mount(element, props, trigger, watch) {
      const editor = new NodeEditor(element, props, trigger, watch);
      editor.root.stepstudioEditor = editor; // for tests and the console: $(".sse-root").stepstudioEditor
      const kit = window.StepStudioEditorKit;
      for (const part of window.StepStudioEditorParts || []) part(editor, kit);
      editor.start();
      return editor;
    },
  };
})();
