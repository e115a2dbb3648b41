/* The editor and the window (a part of studio/page/web/node_editor.js).
 *
 * The editor is the page: its canvas reaches from the window's left edge to its right one, and from
 * under the page's tabs to the window's bottom as the page opens (the results gallery and the live
 * views follow below it). Its panels float over the canvas (NodeEditor.build), and the tab's queue
 * controls (Gradio's Pause / Resume / Clear row and its line, built in Python:
 * studio/page/queue_controls.py) are moved onto its run bar. ⇱ Full screen (on the canvas's top-right
 * corner) also hides the page's header and tabs; Escape leaves it (editor_shortcuts.js).
 *
 * While the mouse is held down on the canvas (a pan, a node or a link being dragged) the panels let
 * it through, so a drag that crosses or ends over one goes on on the canvas beneath.
 */
(function () {
  "use strict";

  const MIN_HEIGHT = 420; // px: a window shorter than the page's header and this scrolls

  class PageFill {
    constructor(editor) {
      this.editor = editor;
      const again = () => this.fitSoon();
      window.addEventListener("resize", again);
      // The page above the editor settles after it mounts (fonts, the header, a restart banner), and
      // a hidden tab shown again has a size at last: the body's size follows all of them.
      if (window.ResizeObserver) new ResizeObserver(again).observe(document.body);
      this.fitSoon();
    }

    fitSoon() {
      if (this.frame) return;
      this.frame = requestAnimationFrame(() => { this.frame = null; this.fit(); });
    }

    // The root steps out of the page's margins to the window's edges (CSS: --sse-page-*).
    fit() {
      const root = this.editor.root, holder = root.parentElement;
      if (!holder || root.classList.contains("sse-full")) return;
      const box = holder.getBoundingClientRect();
      if (!box.width) return; // another tab of the page shows
      const top = root.getBoundingClientRect().top + window.scrollY;
      const sizes = { "--sse-page-left": `${box.left + window.scrollX}px`,
                      "--sse-page-width": `${document.documentElement.clientWidth}px`,
                      "--sse-page-height": `${Math.max(MIN_HEIGHT, Math.floor(window.innerHeight - top))}px` };
      let changed = false;
      for (const [name, value] of Object.entries(sizes)) {
        if (root.style.getPropertyValue(name) === value) continue;
        root.style.setProperty(name, value);
        changed = true;
      }
      if (changed) this.editor.emit("view");
    }
  }

  class FullScreen {
    constructor(editor, kit) {
      this.editor = editor;
      // On the canvas's top-right corner, where the toolbar has no room left.
      this.button = kit.h("button", { class: "sse-btn sse-full-toggle", "data-action": "full-screen",
                                      title: "Fill the window with the editor (Escape leaves)", text: "⇱ Full screen",
                                      onmousedown: (e) => e.stopPropagation(), onclick: () => this.toggle() });
      editor.canvas.appendChild(this.button);
    }

    get on() {
      return this.editor.root.classList.contains("sse-full");
    }

    toggle(on = !this.on) {
      this.editor.root.classList.toggle("sse-full", on);
      document.documentElement.classList.toggle("sse-page-full", on); // no page scrollbar behind it
      this.button.textContent = on ? "⇲ Leave full screen" : "⇱ Full screen";
      this.editor.emit("view");
    }
  }

  // Gradio renders the tab's queue controls after the editor mounts: they are taken once they exist.
  function adoptQueueControls(editor, kit) {
    const ids = editor.props.queue_controls || [];
    if (!ids.length) return;
    const slot = kit.h("div", { class: "sse-queue" });
    editor.runbar.appendChild(slot);
    const take = () => {
      const found = ids.map((id) => document.getElementById(id));
      if (found.some((el) => !el)) return false;
      for (const el of found) slot.appendChild(el);
      return true;
    };
    if (take()) return;
    const watcher = new MutationObserver(() => { if (take()) watcher.disconnect(); });
    watcher.observe(document.body, { childList: true, subtree: true });
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.pageFill = new PageFill(editor);
    editor.fullScreen = new FullScreen(editor, kit);
    adoptQueueControls(editor, kit);
    const body = editor.canvas.parentElement;
    body.addEventListener("mousedown", (e) => {
      if (editor.canvas.contains(e.target)) editor.root.classList.add("sse-dragging");
    }, true);
    window.addEventListener("mouseup", () => editor.root.classList.remove("sse-dragging"));
  });
})();
