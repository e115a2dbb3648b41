/* Pictures on nodes (methods of NodeEditor, studio/page/web/node_editor.js): a Load image's picture
 * and a Mask's painting, kept as data URLs in the node's values, and the dialog that paints a mask.
 */
(function () {
  "use strict";

  const { h } = window.StepStudioEditorKit;
  const MAX_PICTURE_BYTES = 8 * 1024 * 1024; // the server's limit for one picture (studio/pictures.py)

  class EditorPictures {
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

  (window.StepStudioEditorMethods = window.StepStudioEditorMethods || []).push(EditorPictures);
})();
