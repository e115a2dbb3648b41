/* The toolbar (methods of NodeEditor, studio/page/web/node_editor.js), floating over the canvas's
 * top: run and cancel, load an example or a saved workflow, save, download, upload (a workflow's
 * JSON, or a PNG the studio made: its workflow is read from the file), undo and redo, zoom and fit,
 * and Help: what the gestures are, in a panel over the canvas (Escape or Help again closes it).
 */
(function () {
  "use strict";

  const { h, SAVED_KEY } = window.StepStudioEditorKit;
  const PNG_SIGNATURE = [137, 80, 78, 71, 13, 10, 26, 10];

  // What the Help panel says: the editor's gestures in short (docs/workflows.md has them all).
  const HELP = [
    ["Add a node", "double-click the canvas and type a name or a port type; or drag one from Nodes on the left (or click it)."],
    ["Link", "drag from an output to an input of the same colour. A link dropped on empty canvas offers the nodes " +
             "that fit it; drag a linked input to take its link off, and drop it on another input or let it go."],
    ["Run", "▶ Run or Ctrl+Enter; ■ Cancel or Ctrl+Alt+Enter. Every branch of a Sampler (each combination of its " +
            "inputs' values) is one engine request; branches and other people's requests share each denoise forward. " +
            "Pause queue holds your requests that have not started."],
    ["Edit", "right-click for menus; Shift+drag selects several nodes; Ctrl+C / Ctrl+V / Ctrl+D copy, paste (also in " +
             "another tab) and duplicate; Ctrl+G groups; Ctrl+B bypasses; Del deletes; Ctrl+Z undoes, Ctrl+Shift+Z redoes."],
    ["Move around", "drag the canvas or the minimap; Ctrl+wheel, − and + zoom; Fit shows every node; ⇱ Full screen " +
                    "hides the page around the editor (Escape leaves)."],
    ["Results", "on the nodes while they run, then in the gallery under the editor (scroll down) and in History."],
  ];

  class EditorToolbar {
    buildToolbar() {
      const button = (label, action, title, extra) =>
        h("button", { class: "sse-btn " + (extra || ""), "data-action": action, title: title || label, text: label,
                      onclick: () => this.onAction(action) });
      this.exampleSelect = h("select", { class: "sse-examples", title: "Load a workflow", onchange: (e) => this.onLoadChoice(e) });
      this.fileInput = h("input", { type: "file", accept: ".json,.png,application/json,image/png", class: "sse-file",
                                    onchange: (e) => this.onUpload(e.target.files[0]) });
      this.helpPanel = h("div", { class: "sse-help", role: "dialog", "aria-label": "How the editor works", hidden: true }, [
        h("div", { class: "sse-help-head" }, [h("b", { text: "How the editor works" }),
                                              button("×", "help", "Close (Escape)", "sse-help-close")]),
        h("dl", {}, HELP.flatMap(([what, how]) => [h("dt", { text: what }), h("dd", { text: how })])),
      ]);
      return h("div", { class: "sse-toolbar" }, [
        button("▶ Run", "run", "Run the workflow on the shared engine (Ctrl+Enter)", "sse-primary sse-run"),
        button("■ Cancel", "cancel", "Cancel the whole run at the next step boundary (Ctrl+Alt+Enter)", "sse-stop sse-cancel"),
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
        h("span", { class: "sse-sep" }),
        button("? Help", "help", "How the editor works: its gestures and keys"),
      ]);
    }

    refreshLoadChoices() {
      const select = this.exampleSelect;
      select.innerHTML = "";
      select.appendChild(h("option", { value: "", text: "Load…" }));
      for (const name of Object.keys(this.examples)) select.appendChild(h("option", { value: "example:" + name, text: "Example: " + name }));
      const saved = this.readStorage(SAVED_KEY) || {};
      for (const name of Object.keys(saved)) select.appendChild(h("option", { value: "saved:" + name, text: "Saved: " + name }));
    }

    // Shows or hides the Help panel; true when it was open (and is now closed).
    toggleHelp(show = this.helpPanel.hidden) {
      const was = !this.helpPanel.hidden;
      this.helpPanel.hidden = !show;
      return was;
    }

    onAction(action) {
      if (action === "help") return this.toggleHelp();
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

  (window.StepStudioEditorMethods = window.StepStudioEditorMethods || []).push(EditorToolbar);
})();
