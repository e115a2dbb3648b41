/* A picture shown large: a click on a grid (the Grid node's X/Y plot, a run result opened in the
 * results gallery, History's selected picture) or on an Image output node's result opens it over
 * the page at a size whose labels read: enlarged by a whole factor, so its pixels (and a grid's
 * lettering) stay sharp, or shrunk to fit a window smaller than it. Escape, a click anywhere or
 * × closes it. Loaded with the node editor (studio/page/workflow_tab.py, editor_head); it watches
 * the whole page, so it works on every tab.
 */
(function () {
  "use strict";

  const TARGETS = [
    "#ss-node-editor img.sse-grid",
    "#ss-node-editor .sse-result img",
    "#ss-workflow-results img[data-testid='detailed-image']",
    "#ss-history-view img",
  ].join(", ");
  const MOVED_PX = 4; // a press that moved further was a drag (of a node, of the canvas), not a click
  const ROOM = { width: 0.94, height: 0.86 }; // of the window, for the picture

  let pressedAt = null;

  function scaleFor(width, height) {
    const fit = Math.min((window.innerWidth * ROOM.width) / width, (window.innerHeight * ROOM.height) / height);
    return fit >= 1 ? Math.floor(fit) : fit;
  }

  function close() {
    for (const box of document.querySelectorAll(".ss-lightbox")) box.remove();
  }

  function open(source) {
    close();
    const scale = scaleFor(source.naturalWidth, source.naturalHeight);
    const picture = document.createElement("img");
    picture.src = source.currentSrc || source.src;
    picture.alt = source.alt || "";
    picture.style.width = Math.round(source.naturalWidth * scale) + "px";
    picture.style.height = Math.round(source.naturalHeight * scale) + "px";
    picture.dataset.scale = String(scale);
    const caption = document.createElement("figcaption");
    caption.textContent = source.alt || source.title || "";
    const shut = document.createElement("button");
    shut.className = "ss-lightbox-close";
    shut.type = "button";
    shut.title = "Close (Esc)";
    shut.textContent = "×";
    const box = document.createElement("figure");
    box.className = "ss-lightbox";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-modal", "true");
    box.setAttribute("aria-label", caption.textContent || "picture");
    box.append(shut, picture, caption);
    box.addEventListener("click", (event) => { event.stopPropagation(); close(); });
    document.body.appendChild(box);
    shut.focus();
  }

  document.addEventListener("pointerdown", (event) => { pressedAt = { x: event.clientX, y: event.clientY }; }, true);

  // Capture phase: before drawflow (which would select the node) or Gradio (which would step the preview).
  document.addEventListener("click", (event) => {
    const source = event.target instanceof Element ? event.target.closest(TARGETS) : null;
    if (!source || !source.naturalWidth) return;
    if (pressedAt && Math.hypot(event.clientX - pressedAt.x, event.clientY - pressedAt.y) > MOVED_PX) return;
    event.preventDefault();
    event.stopPropagation();
    open(source);
  }, true);

  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && document.querySelector(".ss-lightbox")) {
      event.stopPropagation();
      close();
    }
  }, true);

  window.StepStudioLightbox = { open, close };
})();
