/* Full screen (a part of studio/page/web/node_editor.js): the editor over the whole window, its
 * canvas taking every pixel the toolbar and run bar leave. The ⇱ button on the canvas's corner toggles it, and
 * Escape leaves it (editor_shortcuts.js). Out of full screen the canvas is as tall as the window
 * less the toolbar (editor_gestures.css), so scrolling the page to the editor shows all of it.
 */
(function () {
  "use strict";

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

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.fullScreen = new FullScreen(editor, kit);
  });
})();
