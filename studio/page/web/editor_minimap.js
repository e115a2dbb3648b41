/* The minimap (a part of studio/page/web/node_editor.js): every node and group in small, each node
 * in the colour its title shows on the canvas (a bypassed node's purple, faded as it is there), and
 * the part of the canvas on screen as a frame. A click or a drag on it brings that place to the
 * middle of the view.
 *
 * It sits in a corner of the canvas's free part (NodeEditor.freeArea: no panel there), bottom-right
 * first; where a node lies under it, it moves to the first corner free of nodes (top-right,
 * bottom-left, top-left), and with none free it hides until one is. It stays put while it is
 * being dragged.
 *
 * drawflow scales its canvas about the canvas's centre: a canvas point p shows at
 * W/2 + (p - W/2) * zoom + translate (see NodeEditor.fit).
 */
(function () {
  "use strict";

  const WIDTH = 200, HEIGHT = 130, MARGIN = 60;
  const CATEGORY_COLORS = { values: "#64748b", "fan-out": "#7c3aed", pictures: "#0891b2", sampler: "#ea580c", outputs: "#059669" };
  const CORNERS = ["bottom-right", "top-right", "bottom-left", "top-left"]; // in the order it tries them
  const INSET = 10; // px from the free part's edges

  class Minimap {
    constructor(editor, kit) {
      this.editor = editor;
      this.df = editor.df;
      this.canvas = kit.h("canvas", { class: "sse-minimap", width: WIDTH, height: HEIGHT,
                                      title: "Minimap: click or drag to move the view" });
      editor.canvas.appendChild(this.canvas);
      const redraw = () => this.redrawSoon();
      for (const name of ["translate", "zoom", "nodeMoved"]) this.df.on(name, redraw);
      this.df.on("mouseMove", () => { if (this.df.drag || this.df.editor_selected) redraw(); });
      for (const name of ["committed", "view", "loaded"]) editor.on(name, redraw);
      window.addEventListener("resize", redraw);
      // The canvas's own size (full screen, the page settling, its tab shown again) moves the corners.
      if (window.ResizeObserver) new ResizeObserver(redraw).observe(editor.canvas);
      this.canvas.addEventListener("mousedown", (e) => this.onPress(e));
    }

    // ------------------------------------------------------------------ the view
    view() {
      // (translate x, translate y, zoom) as drawn now, a pan in progress included.
      const matrix = new DOMMatrix(this.df.precanvas.style.transform || "none");
      return { tx: matrix.e, ty: matrix.f, zoom: matrix.a || 1 };
    }

    visible() {
      // The canvas rectangle on screen, in canvas pixels.
      const pre = this.df.precanvas, W = pre.clientWidth, H = pre.clientHeight, { tx, ty, zoom } = this.view();
      const at = (s, t, size) => size / 2 + (s - t - size / 2) / zoom;
      return { x: at(0, tx, W), y: at(0, ty, H), w: W / zoom, h: H / zoom };
    }

    centreOn(x, y) {
      const pre = this.df.precanvas, W = pre.clientWidth, H = pre.clientHeight, zoom = this.df.zoom;
      const tx = -(x - W / 2) * zoom, ty = -(y - H / 2) * zoom;
      Object.assign(this.df, { canvas_x: tx, canvas_y: ty });
      pre.style.transform = `translate(${tx}px, ${ty}px) scale(${zoom})`;
      this.redrawSoon();
    }

    // ------------------------------------------------------------------ drawing
    boxes() {
      const data = this.df.drawflow.drawflow.Home.data;
      return Object.values(data).map((node) => {
        const el = this.editor.nodeElement(node.id);
        const spec = this.editor.types[node.name] || {};
        // As the canvas draws it: its title's colour (its category's, the user's, or bypassed) and its opacity.
        const title = el && el.querySelector(".sse-title");
        return { x: node.pos_x, y: node.pos_y, w: el ? el.offsetWidth : 200, h: el ? el.offsetHeight : 100,
                 color: title ? getComputedStyle(title).backgroundColor : CATEGORY_COLORS[spec.category] || "#64748b",
                 alpha: el ? Number(getComputedStyle(el).opacity) : 1 };
      });
    }

    layout() {
      // The world the minimap shows (every node, group and the view, with a margin) and its scale.
      const groups = (this.editor.groups ? this.editor.groups.items : []).map((g) => ({ x: g.x, y: g.y, w: g.w, h: g.h }));
      const view = this.visible();
      const all = this.boxes().concat(groups, [view]);
      const minX = Math.min(...all.map((b) => b.x)) - MARGIN, minY = Math.min(...all.map((b) => b.y)) - MARGIN;
      const maxX = Math.max(...all.map((b) => b.x + b.w)) + MARGIN, maxY = Math.max(...all.map((b) => b.y + b.h)) + MARGIN;
      const scale = Math.min(WIDTH / (maxX - minX), HEIGHT / (maxY - minY));
      const offX = (WIDTH - (maxX - minX) * scale) / 2, offY = (HEIGHT - (maxY - minY) * scale) / 2;
      return { minX, minY, scale, offX, offY, view, groups };
    }

    redrawSoon() {
      if (this.frame) return;
      this.frame = requestAnimationFrame(() => { this.frame = null; this.draw(); });
    }

    draw() {
      const ctx = this.canvas.getContext("2d");
      const map = this.map = this.layout();
      const px = (b) => [map.offX + (b.x - map.minX) * map.scale, map.offY + (b.y - map.minY) * map.scale,
                         Math.max(2, b.w * map.scale), Math.max(2, b.h * map.scale)];
      ctx.clearRect(0, 0, WIDTH, HEIGHT);
      ctx.fillStyle = "rgba(148,163,184,0.18)";
      for (const group of map.groups) ctx.fillRect(...px(group));
      for (const box of this.boxes()) {
        ctx.fillStyle = box.color;
        ctx.globalAlpha = box.alpha;
        ctx.fillRect(...px(box));
      }
      ctx.globalAlpha = 1;
      ctx.strokeStyle = "#2563eb";
      ctx.lineWidth = 1.5;
      ctx.strokeRect(...px(map.view));
      this.canvas.dataset.nodes = String(this.boxes().length);
      this.place();
    }

    // ------------------------------------------------------------------ where it sits
    // The first corner where no node lies under it (none: it hides).
    place() {
      const free = this.editor.freeArea();
      if (this.pressing || !free.width) return; // being dragged; or its tab is hidden
      const nodes = [...this.editor.canvas.querySelectorAll(".drawflow-node")].map((el) => el.getBoundingClientRect());
      if (this.canvas.offsetWidth) this.size = [this.canvas.offsetWidth, this.canvas.offsetHeight]; // (hidden: as last shown)
      const [w, h] = this.size || [WIDTH, HEIGHT];
      const spot = (corner) => {
        const left = corner.endsWith("left") ? free.left + INSET : free.right - INSET - w;
        const top = corner.startsWith("top") ? free.top + INSET : free.bottom - INSET - h;
        return { left, top, right: left + w, bottom: top + h };
      };
      const overlaps = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
      const corner = CORNERS.find((name) => !nodes.some((box) => overlaps(spot(name), box))) || "none";
      this.canvas.dataset.corner = corner;
      this.canvas.style.display = corner === "none" ? "none" : "";
      if (corner === "none") return;
      const box = this.editor.canvas.getBoundingClientRect(), at = spot(corner);
      Object.assign(this.canvas.style, { left: `${at.left - box.left}px`, top: `${at.top - box.top}px`, right: "auto", bottom: "auto" });
    }

    // ------------------------------------------------------------------ pointer
    onPress(event) {
      if (event.button !== 0) return;
      event.stopPropagation(); // not a pan or a box (drawflow, editor_selection.js)
      event.preventDefault();
      const map = this.layout(); // as things are now (a redraw may be a frame behind), kept for the drag
      const to = (e) => {
        const box = this.canvas.getBoundingClientRect();
        const x = (e.clientX - box.left) * WIDTH / box.width, y = (e.clientY - box.top) * HEIGHT / box.height;
        this.centreOn(map.minX + (x - map.offX) / map.scale, map.minY + (y - map.offY) / map.scale);
      };
      to(event);
      this.pressing = true; // the view moves under it: it keeps its corner until released
      const up = () => {
        this.pressing = false;
        this.redrawSoon();
        window.removeEventListener("mousemove", to);
        window.removeEventListener("mouseup", up, true);
      };
      window.addEventListener("mousemove", to);
      window.addEventListener("mouseup", up, true);
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.minimap = new Minimap(editor, kit);
  });
})();
