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
 * The gestures (search, menus, selection, clipboard, groups, minimap, shortcuts) live in their own
 * editor_*.js files: each registers a part in window.StepStudioEditorParts, attached to the editor
 * before its first workflow loads, and talks to it through on()/emit() (events: "saving" with the
 * workflow being written, "loaded" with the workflow and its new node ids, "inserted" with one
 * pasted node's JSON and its new id, "committed", "view").
 */
(function () {
  "use strict";

  const STORAGE_KEY = "stepstudio.workflow.current";
  const SAVED_KEY = "stepstudio.workflow.saved";
  const UNDO_LIMIT = 100;
  const PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];
  const MAX_PICTURE_BYTES = 8 * 1024 * 1024; // the server's limit for one picture (studio/pictures.py)
  const PICTURE_KINDS = ["picture", "mask"]; // fields that hold a picture as a data URL

  function h(tag, attrs, children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") el.textContent = value;
      else if (key === "class") el.className = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children || []) if (child) el.appendChild(child);
    return el;
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

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
    build() {
      this.root.innerHTML = "";
      const button = (label, action, title, extra) =>
        h("button", { class: "sse-btn " + (extra || ""), "data-action": action, title: title || label, text: label,
                      onclick: () => this.onAction(action) });
      this.exampleSelect = h("select", { class: "sse-examples", title: "Load a workflow", onchange: (e) => this.onLoadChoice(e) });
      this.fileInput = h("input", { type: "file", accept: ".json,.png,application/json,image/png", class: "sse-file",
                                    onchange: (e) => this.onUpload(e.target.files[0]) });
      this.message = h("span", { class: "sse-message", role: "status" });
      const toolbar = this.toolbar = h("div", { class: "sse-toolbar" }, [
        button("▶ Run", "run", "Run the workflow on the shared engine", "sse-primary sse-run"),
        button("■ Cancel", "cancel", "Cancel the whole run at the next step boundary", "sse-stop sse-cancel"),
        h("span", { class: "sse-sep" }),
        this.exampleSelect,
        button("Save", "save", "Save this workflow in the browser"),
        button("Download", "download", "Download the workflow as JSON"),
        button("Upload", "upload", "Open a workflow JSON (or a PNG made from a workflow)"),
        this.fileInput,
        h("span", { class: "sse-sep" }),
        button("↶ Undo", "undo", "Undo the last edit (Ctrl+Z)"),
        button("↷ Redo", "redo", "Redo what was undone (Ctrl+Shift+Z or Ctrl+Y)"),
        button("−", "zoom-out", "Zoom out"),
        button("+", "zoom-in", "Zoom in"),
        button("1:1", "zoom-reset", "Reset zoom"),
        button("Fit", "fit", "Show every node"),
        button("Clear", "clear", "Remove every node"),
        this.message,
      ]);
      this.palette = h("div", { class: "sse-palette" });
      this.canvas = h("div", { class: "sse-canvas", ondragover: (e) => e.preventDefault(), ondrop: (e) => this.onDrop(e) });
      this.runbar = h("div", { class: "sse-runbar" }, [h("span", { class: "sse-run-text", text: "Ready." }),
                                                      h("progress", { class: "sse-run-progress", value: 0, max: 1 })]);
      this.root.appendChild(toolbar);
      this.root.appendChild(h("div", { class: "sse-body" }, [this.palette, this.canvas]));
      this.root.appendChild(this.runbar);
      this.buildPalette();
      this.refreshLoadChoices();
    }

    buildPalette() {
      const categories = ["values", "fan-out", "pictures", "sampler", "outputs"];
      const titles = { values: "Values", "fan-out": "Fan-out", pictures: "Pictures", sampler: "Sampler", outputs: "Outputs" };
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

    refreshLoadChoices() {
      const select = this.exampleSelect;
      select.innerHTML = "";
      select.appendChild(h("option", { value: "", text: "Load…" }));
      for (const name of Object.keys(this.examples)) select.appendChild(h("option", { value: "example:" + name, text: "Example: " + name }));
      const saved = this.readStorage(SAVED_KEY) || {};
      for (const name of Object.keys(saved)) select.appendChild(h("option", { value: "saved:" + name, text: "Saved: " + name }));
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

    // ------------------------------------------------------------------ pictures
    // A Load image's picture and a Mask's painting are data URLs in the node's values (so a
    // workflow file carries its inputs). A picture arrives by the node's Choose… button, by a
    // file dropped on the node, or from History (the History tab's "Send to the editor").
    wirePicture(id, box) {
      const field = box.dataset.field;
      const stop = (e) => e.stopPropagation();
      const pick = box.querySelector(".sse-picture-pick");
      pick.addEventListener("mousedown", stop);
      if (box.dataset.kind === "mask") {
        pick.addEventListener("click", (e) => { stop(e); this.paintMask(id, field); });
      } else {
        const input = h("input", { type: "file", accept: "image/png,image/jpeg,image/webp", class: "sse-file",
                                   onchange: (e) => { this.readPicture(e.target.files[0], id, field); e.target.value = ""; } });
        box.appendChild(input);
        pick.addEventListener("click", (e) => { stop(e); input.click(); });
        box.addEventListener("dragover", (e) => { e.preventDefault(); box.classList.add("sse-dropping"); });
        box.addEventListener("dragleave", () => box.classList.remove("sse-dropping"));
        box.addEventListener("drop", (e) => {
          e.preventDefault();
          e.stopPropagation();
          box.classList.remove("sse-dropping");
          const file = e.dataTransfer.files && e.dataTransfer.files[0];
          if (file) this.readPicture(file, id, field);
        });
      }
      this.showPicture(id, field);
    }

    readPicture(file, id, field) {
      if (!file) return;
      if (!/^image\/(png|jpeg|webp)$/.test(file.type)) { this.say(`${file.name} is not a PNG, JPEG or WEBP picture.`, "error"); return; }
      if (file.size > MAX_PICTURE_BYTES) { this.say(`${file.name} is ${file.size} bytes; pictures are limited to ${MAX_PICTURE_BYTES}.`, "error"); return; }
      const reader = new FileReader();
      reader.onload = () => { this.setPicture(id, field, reader.result); this.say(`Loaded ${file.name}.`); };
      reader.readAsDataURL(file);
    }

    setPicture(id, field, url, extra) {
      const node = this.nodeData(id);
      this.df.updateNodeDataFromId(id, { ...node.data, ...(extra || {}), [field]: url });
      this.syncFields(id);
      this.changed();
    }

    showPicture(id, field) {
      const el = this.nodeElement(id);
      const box = el && el.querySelector(`.sse-picture[data-field="${field}"]`);
      if (!box) return;
      const url = this.nodeData(id).data[field] || "";
      const img = box.querySelector(".sse-picture-img");
      const shown = url.startsWith("data:image/");
      if (shown && img.getAttribute("src") !== url) img.src = url;
      img.style.display = shown ? "" : "none";
      const empty = box.querySelector(".sse-picture-empty");
      empty.style.display = shown ? "none" : "";
      if (url && !shown) empty.textContent = url; // a saved result's name
      box.dataset.has = shown ? "yes" : "no";
    }

    // The picture a Mask paints over: the Load image linked to it, else the one that feeds the
    // sampler it feeds; its size is the painting's.
    maskBackground(maskId) {
      const data = this.df.drawflow.drawflow.Home.data;
      const pictureOf = (nodeId) => {
        const node = data[nodeId];
        return node && node.name === "load_image" ? node.data.image : null;
      };
      const mask = data[maskId];
      for (const input of Object.values(mask.inputs)) for (const conn of input.connections) {
        const found = pictureOf(conn.node);
        if (found) return found;
      }
      for (const output of Object.values(mask.outputs)) for (const conn of output.connections) {
        const sampler = data[conn.node];
        for (const input of Object.values(sampler.inputs)) for (const c of input.connections) {
          const found = pictureOf(c.node);
          if (found) return found;
        }
      }
      return null;
    }

    paintMask(id, field) {
      const background = this.maskBackground(id);
      const previous = this.nodeData(id).data[field];
      const start = (width, height, image) => new MaskPainter(this.root, width, height, image, previous,
        (url) => { this.setPicture(id, field, url, { source: "painted" }); this.say("Mask painted."); });
      if (!background) return start(64, 64, null);
      const image = new Image();
      image.onload = () => start(image.naturalWidth, image.naturalHeight, image);
      image.src = background;
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
      // Near the top-left of what is visible, shifted a little per node so they don't stack.
      const rect = this.canvas.getBoundingClientRect();
      const count = Object.keys(this.df.drawflow.drawflow.Home.data).length;
      const point = this.toCanvas(rect.left + 40 + (count % 6) * 24, rect.top + 30 + (count % 6) * 24);
      return this.addNode(typeName, point.x, point.y);
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

    // ------------------------------------------------------------------ workflow <-> editor
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

    // ------------------------------------------------------------------ toolbar
    onAction(action) {
      if (action === "run") return this.run();
      if (action === "cancel") return this.cancelRun();
      if (action === "save") return this.save();
      if (action === "download") return this.download();
      if (action === "upload") return this.fileInput.click();
      if (action === "undo") return this.undo();
      if (action === "redo") return this.redo();
      if (action === "zoom-in") return this.df.zoom_in();
      if (action === "zoom-out") return this.df.zoom_out();
      if (action === "zoom-reset") return this.df.zoom_reset();
      if (action === "fit") return this.fit();
      if (action === "clear") { this.load({ version: 1, nodes: [], links: [] }, "Cleared (Undo brings it back)."); }
    }

    fit() {
      // Zoom and pan so every node shows. drawflow scales its canvas about the canvas's centre:
      // a point p lands at W/2 + (p - W/2) * zoom + translate.
      const boxes = Object.values(this.df.drawflow.drawflow.Home.data).map((node) => {
        const el = this.nodeElement(node.id);
        return { x: node.pos_x, y: node.pos_y, w: el ? el.offsetWidth : 200, h: el ? el.offsetHeight : 100 };
      });
      if (!boxes.length) return;
      const minX = Math.min(...boxes.map((b) => b.x)), maxX = Math.max(...boxes.map((b) => b.x + b.w));
      const minY = Math.min(...boxes.map((b) => b.y)), maxY = Math.max(...boxes.map((b) => b.y + b.h));
      const pre = this.df.precanvas, W = pre.clientWidth, H = pre.clientHeight, pad = 24;
      const zoom = Math.max(this.df.zoom_min, Math.min(1, (W - 2 * pad) / (maxX - minX), (H - 2 * pad) / (maxY - minY)));
      const x = pad + ((W - 2 * pad) - (maxX - minX) * zoom) / 2 - W / 2 - (minX - W / 2) * zoom;
      const y = pad + ((H - 2 * pad) - (maxY - minY) * zoom) / 2 - H / 2 - (minY - H / 2) * zoom;
      Object.assign(this.df, { zoom, zoom_last_value: zoom, canvas_x: x, canvas_y: y });
      pre.style.transform = `translate(${x}px, ${y}px) scale(${zoom})`;
      this.emit("view");
    }

    run() {
      clearTimeout(this.typingTimer);
      this.commit();
      this.clearProblems();
      this.say("Submitting…");
      this.trigger("submit");
    }

    // Cancels go to Python as the component's `stop` event (a Gradio event, so the server
    // knows the caller's session); the run's next state shows the result.
    cancelRun() {
      const state = this.runState;
      if (!state || !state.run_id || state.state !== "running") { this.say("No run to cancel."); return; }
      this.trigger("stop", { run_id: state.run_id, index: -1 });
      this.say("Cancelling the run at the next step boundary…");
    }

    cancelBranch(index) {
      const state = this.runState;
      if (!state || !state.run_id) return;
      this.trigger("stop", { run_id: state.run_id, index });
      this.say(`Cancelling branch ${index} at the next step boundary…`);
    }

    onLoadChoice(event) {
      const value = event.target.value;
      event.target.value = "";
      if (value.startsWith("example:")) {
        this.load(this.examples[value.slice(8)], "Loaded example " + value.slice(8) + ".");
        this.fit();
      }
      else if (value.startsWith("saved:")) {
        const saved = this.readStorage(SAVED_KEY) || {};
        this.load(saved[value.slice(6)], "Loaded " + value.slice(6) + ".");
      }
    }

    save() {
      const name = window.prompt("Save this workflow in the browser as:", "my workflow");
      if (!name) return;
      const saved = this.readStorage(SAVED_KEY) || {};
      saved[name] = this.toWorkflow();
      localStorage.setItem(SAVED_KEY, JSON.stringify(saved));
      this.refreshLoadChoices();
      this.say("Saved as " + name + ".");
    }

    download() {
      const blob = new Blob([JSON.stringify(this.toWorkflow(), null, 2)], { type: "application/json" });
      const link = h("a", { href: URL.createObjectURL(blob), download: "workflow.json" });
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 1000);
    }

    async onUpload(file, dropPoint) {
      if (!file) return;
      this.fileInput.value = "";
      const bytes = new Uint8Array(await file.arrayBuffer());
      let text = null;
      if (PNG_SIGNATURE.every((b, i) => bytes[i] === b)) text = pngText(bytes, "workflow");
      else if (!/^image\//.test(file.type)) text = new TextDecoder().decode(bytes);
      if (text === null && dropPoint && this.types.load_image) {
        // A picture without a workflow, dropped on the canvas: a Load image node holding it.
        const id = this.addNode("load_image", dropPoint.x, dropPoint.y);
        this.readPicture(file, id, "image");
        return;
      }
      if (text === null) {
        this.say("This picture carries no workflow: drop it on the canvas, or on a Load image node, to start from it.", "error");
        return;
      }
      const workflow = this.parse(text);
      if (!workflow) { this.say("The file is not workflow JSON.", "error"); return; }
      this.load(workflow, "Opened " + file.name + ".");
    }

    // ------------------------------------------------------------------ run state (from Python)
    // Every update has every branch's state row, but a branch's preview only in the update where
    // it is new (studio/page/run_state.py): a branch keeps its preview from the updates before.
    mergeRun(update) {
      const previous = this.runState;
      if (!update.branches || !previous || previous.run_id !== update.run_id) return update;
      const before = {};
      for (const branch of previous.branches || []) before[branch.index] = branch;
      const branches = update.branches.map((branch) => ("preview" in branch || !before[branch.index]
        ? branch : { ...branch, preview: before[branch.index].preview }));
      return { ...update, branches };
    }

    showRun(update) {
      if (!update) return;
      const state = this.mergeRun(update);
      this.runState = state;
      if (state.state === "invalid") { this.showProblems(state.problems || []); return; }
      this.runbar.querySelector(".sse-run-text").textContent = this.runText(state);
      const bar = this.runbar.querySelector(".sse-run-progress");
      bar.max = Math.max(1, state.total_steps || 1);
      bar.value = state.steps_done || 0;
      this.root.dataset.runState = state.state;
      if (state.state !== "running") this.say("Run " + state.state + ".");
      else this.say("");
      const byIndex = {};
      for (const branch of state.branches || []) byIndex[branch.index] = branch;
      for (const [nodeId, view] of Object.entries(state.nodes || {})) {
        const el = this.nodeElement(nodeId);
        if (!el) continue;
        el.dataset.state = view.state;
        const live = el.querySelector(".sse-live");
        const branches = (view.branches || []).map((i) => byIndex[i]).filter(Boolean);
        const ended = {};
        for (const b of branches) ended[b.state] = (ended[b.state] || 0) + 1;
        // "running 0/4": of finished branches (short: a node's header is narrow); the tooltip says all.
        const badge = el.querySelector(".sse-badge");
        badge.textContent = view.total ? `${view.state} ${ended.completed || 0}/${view.total}` : "";
        badge.title = view.total ? this.countsText(ended, view.total) : "";
        const liveView = this.types[el.dataset.nodeType].live_view;  // what the node type says it shows
        if (!view.total) {  // in no branch (bypassed, or feeding no sampler): nothing of an earlier run stays
          live.innerHTML = "";
          for (const key of ["runId", "count", "grid"]) delete live.dataset[key];
          continue;
        }
        if (liveView === "branch_bars") this.showBranchBars(live, branches);
        else if (liveView === "previews") this.showThumbs(live, branches, (b) => b.preview || b.image, "sse-preview");
        // An output node shows each branch's live preview until its result replaces it.
        else if (liveView === "results") this.showThumbs(live, branches, (b) => b.image || b.preview, "sse-result");
        else if (liveView === "grid") {
          const grid = (state.grids || {})[nodeId];
          if (grid && live.dataset.grid !== grid) {  // a new drawing (a file URL): fetched once
            live.innerHTML = `<img class="sse-grid" src="${escapeHtml(grid)}" alt="X/Y grid">`;
            live.dataset.grid = grid;
          }
        }
      }
    }

    // Rows and thumbnails are made once per run and updated in place, so a click on a
    // branch's cancel button never lands on an element that was just replaced.
    liveItems(live, runId, branches, make) {
      if (live.dataset.runId !== runId || live.dataset.count !== String(branches.length)) {
        live.innerHTML = "";
        live.items = {};
        live.dataset.runId = runId;
        live.dataset.count = String(branches.length);
        const container = make.container ? make.container(branches) : live;
        if (container !== live) live.appendChild(container);
        for (const b of branches) {
          live.items[b.index] = make.item(b);
          container.appendChild(live.items[b.index].root);
        }
      }
      return live.items;
    }

    showBranchBars(live, branches) {
      const items = this.liveItems(live, this.runState.run_id, branches, {
        item: (b) => {
          const bar = h("progress", { value: 0, max: 1 });
          const step = h("span", { class: "sse-branch-step" });
          const cancel = h("span", { class: "sse-branch-cancel", title: "Cancel this branch", text: "×",
                                     onmousedown: (e) => e.stopPropagation(),
                                     onclick: (e) => { e.stopPropagation(); this.cancelBranch(b.index); } });
          const root = h("div", { class: "sse-branch", "data-index": b.index },
                         [h("span", { class: "sse-branch-label", text: b.label }), bar, step, cancel]);
          return { root, bar, step, cancel };
        },
      });
      for (const b of branches) {
        const item = items[b.index];
        const ended = ["completed", "aborted", "failed"].includes(b.state);
        item.root.dataset.state = b.state;
        item.root.title = b.message || b.state;
        item.bar.max = Math.max(1, b.total);
        item.bar.value = b.step;
        // A queued branch of a paused queue says so: it waits for Resume (or for the operator).
        const shown = b.state === "queued" && b.paused ? (b.paused === "engine" ? "paused (studio)" : "paused") : b.state;
        item.step.textContent = b.state === "running" || b.state === "completed" ? `${b.step}/${b.total}` : shown;
        item.cancel.style.visibility = ended ? "hidden" : "visible";
      }
    }

    showThumbs(live, branches, pick, cls) {
      const items = this.liveItems(live, this.runState.run_id, branches, {
        container: () => h("div", { class: "sse-thumbs" + (branches.length <= 2 ? " sse-few" : "") }),
        item: (b) => {
          const img = h("img", { alt: b.label });
          const empty = h("div", { class: "sse-thumb-empty" });
          const root = h("figure", { class: "sse-thumb " + cls, "data-index": b.index },
                         [img, empty, h("figcaption", { text: b.label })]);
          return { root, img, empty };
        },
      });
      for (const b of branches) {
        const item = items[b.index], src = pick(b);
        item.root.dataset.state = b.state;
        if (src && item.img.getAttribute("src") !== src) item.img.src = src;
        item.img.style.display = src ? "" : "none";
        item.empty.style.display = src ? "none" : "";
        item.empty.textContent = b.state;
      }
    }

    runText(state) {
      // "RUNNING · 0/4 finished · 1 aborted" (a run bar once read "1/4" with one branch aborted).
      return `${state.state.toUpperCase()} · ${this.countsText(state.ended || {}, state.total)}` +
             (state.message ? " · " + state.message : "");
    }

    countsText(ended, total) {
      // Finished counts completed branches only; aborted and failed ones are named apart.
      let text = `${ended.completed || 0}/${total} finished`;
      if (ended.aborted) text += ` · ${ended.aborted} aborted`;
      if (ended.failed) text += ` · ${ended.failed} failed`;
      return text;
    }

    showProblems(problems) {
      this.clearProblems();
      const loose = [];
      for (const problem of problems) {
        const el = problem.node ? this.nodeElement(problem.node) : null;
        if (!el) { loose.push(problem.message); continue; }
        el.dataset.state = "invalid";
        el.querySelector(".sse-problems").appendChild(
          h("div", { class: "sse-problem", text: (problem.port ? problem.port + ": " : "") + problem.message }));
      }
      const first = problems[0];
      const where = first && first.node && this.nodeElement(first.node)
        ? this.types[this.nodeData(first.node).name].title + (first.port ? " › " + first.port : "") + ": " : "";
      const summary = first ? where + first.message : "";
      const more = problems.length > 1 ? ` (and ${problems.length - 1} more, marked on the nodes)` : "";
      this.say((loose.length ? loose.join("; ") : summary) + more, "error");
      this.runbar.querySelector(".sse-run-text").textContent = "Not run: the workflow has problems.";
      this.root.dataset.runState = "invalid";
    }

    clearStaleProblems() {
      // A new graph: the old one's problems and its "Not run" no longer apply (a run's state stays).
      this.clearProblems();
      if (this.root.dataset.runState !== "invalid") return;
      delete this.root.dataset.runState;
      this.runbar.querySelector(".sse-run-text").textContent = "Ready.";
    }

    clearProblems() {
      for (const el of this.canvas.querySelectorAll(".sse-problems")) el.innerHTML = "";
      for (const el of this.canvas.querySelectorAll(".drawflow-node[data-state='invalid']")) delete el.dataset.state;
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

  // A dialog to paint a mask over a picture. Its result is a PNG of the picture's size: black =
  // keep, white = repaint (what the Mask node's "painted" value holds).
  class MaskPainter {
    constructor(root, width, height, background, previous, done) {
      Object.assign(this, { width, height, background, done, painting: false, erasing: false });
      this.mask = h("canvas", { width, height });
      this.tint = h("canvas", { width, height });
      const ctx = this.mask.getContext("2d");
      ctx.fillStyle = "#000";
      ctx.fillRect(0, 0, width, height);
      const scale = Math.max(1, Math.floor(420 / Math.max(width, height))); // small pictures shown larger
      this.view = h("canvas", { class: "sse-paint-view", width, height });
      this.view.style.width = width * scale + "px";
      this.view.style.height = height * scale + "px";
      this.brush = h("input", { type: "range", min: 1, max: Math.max(8, Math.round(Math.max(width, height) / 3)),
                                value: Math.max(2, Math.round(Math.max(width, height) / 10)), class: "sse-paint-brush" });
      const button = (label, action, extra) => h("button", { class: "sse-btn " + (extra || ""), type: "button", text: label,
                                                            "data-paint": action, onclick: () => this.onAction(action) });
      this.eraseButton = button("Erase", "erase");
      this.overlay = h("div", { class: "sse-paint-overlay" }, [h("div", { class: "sse-paint-dialog" }, [
        h("div", { class: "sse-paint-title", text: `Paint the part to repaint (${width}x${height})` }),
        this.view,
        h("div", { class: "sse-paint-tools" }, [h("label", { text: "Brush " }, [this.brush]), this.eraseButton,
          button("Clear", "clear"), h("span", { class: "sse-sep" }), button("Cancel", "cancel"),
          button("Use mask", "done", "sse-primary")]),
      ])]);
      for (const [kind, handler] of [["pointerdown", (e) => { this.painting = true; this.view.setPointerCapture(e.pointerId); this.paint(e); }],
                                     ["pointermove", (e) => { if (this.painting) this.paint(e); }],
                                     ["pointerup", () => { this.painting = false; }]]) this.view.addEventListener(kind, handler);
      root.appendChild(this.overlay);
      if (previous && previous.startsWith("data:image/")) {
        const image = new Image();
        image.onload = () => { ctx.drawImage(image, 0, 0, width, height); this.redraw(); };
        image.src = previous;
      }
      this.redraw();
    }

    paint(event) {
      const box = this.view.getBoundingClientRect();
      const x = (event.clientX - box.left) * this.width / box.width, y = (event.clientY - box.top) * this.height / box.height;
      const ctx = this.mask.getContext("2d");
      ctx.fillStyle = this.erasing ? "#000" : "#fff";
      ctx.beginPath();
      ctx.arc(x, y, Number(this.brush.value) / 2, 0, 2 * Math.PI);
      ctx.fill();
      if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = null; this.redraw(); });
    }

    redraw() {
      // The picture, with the part to repaint tinted red.
      const view = this.view.getContext("2d");
      view.clearRect(0, 0, this.width, this.height);
      if (this.background) view.drawImage(this.background, 0, 0, this.width, this.height);
      else { view.fillStyle = "#9ca3af"; view.fillRect(0, 0, this.width, this.height); }
      const mask = this.mask.getContext("2d").getImageData(0, 0, this.width, this.height);
      const tint = new ImageData(this.width, this.height);
      for (let i = 0; i < mask.data.length; i += 4) {
        if (mask.data[i] > 127) tint.data.set([255, 40, 40, 150], i);
      }
      this.tint.getContext("2d").putImageData(tint, 0, 0);
      view.drawImage(this.tint, 0, 0);
    }

    onAction(action) {
      if (action === "erase") {
        this.erasing = !this.erasing;
        this.eraseButton.classList.toggle("sse-primary", this.erasing);
      } else if (action === "clear") {
        const ctx = this.mask.getContext("2d");
        ctx.fillStyle = "#000";
        ctx.fillRect(0, 0, this.width, this.height);
        this.redraw();
      } else {
        if (action === "done") this.done(this.mask.toDataURL("image/png"));
        this.overlay.remove();
      }
    }
  }

  // A tEXt or iTXt chunk's text from PNG bytes (the studio writes the workflow into one).
  function pngText(bytes, keyword) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let offset = 8;
    const decoder = new TextDecoder();
    while (offset + 8 <= bytes.length) {
      const length = view.getUint32(offset);
      const type = decoder.decode(bytes.subarray(offset + 4, offset + 8));
      const data = bytes.subarray(offset + 8, offset + 8 + length);
      if (type === "tEXt" || type === "iTXt") {
        const zero = data.indexOf(0);
        if (decoder.decode(data.subarray(0, zero)) === keyword) {
          if (type === "tEXt") return new TextDecoder("latin1").decode(data.subarray(zero + 1));
          // iTXt: keyword \0 compression-flag compression-method language \0 translated \0 text
          if (data[zero + 1] !== 0) return null; // compressed iTXt is not written by the studio
          let rest = zero + 3;
          rest = data.indexOf(0, rest) + 1;
          rest = data.indexOf(0, rest) + 1;
          return decoder.decode(data.subarray(rest));
        }
      }
      if (type === "IEND") break;
      offset += 12 + length;
    }
    return null;
  }

  window.StepStudioEditor = {
    mount(element, props, trigger, watch) {
      const editor = new NodeEditor(element, props, trigger, watch);
      editor.root.stepstudioEditor = editor; // for tests and the console: $(".sse-root").stepstudioEditor
      const typing = (event) => { // keys typed into a text field are the field's, never a shortcut
        const target = event.target || {};
        return ["INPUT", "TEXTAREA"].includes(target.tagName) || !!target.isContentEditable;
      };
      for (const part of window.StepStudioEditorParts || []) part(editor, { h, escapeHtml, typing });
      editor.start();
      return editor;
    },
  };
})();
