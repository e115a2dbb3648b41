/* What every file of the node editor shares (loaded first; see EDITOR_FILES in
 * studio/page/workflow_tab.py): a tiny element builder, HTML escaping, whether a key goes into a
 * text field, and the browser-storage keys and picture fields of the workflow.
 *
 * The editor is one class, NodeEditor (node_editor.js), whose methods are written by concern in
 * the editor_*.js files that push a class of methods to window.StepStudioEditorMethods (pictures,
 * the workflow and its undo, the toolbar, the run's view); the gestures are parts pushed to
 * window.StepStudioEditorParts, attached to each editor as it mounts.
 */
(function () {
  "use strict";

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

  // Keys typed into a text field are the field's, never a shortcut.
  function typing(event) {
    const target = event.target || {};
    return ["INPUT", "TEXTAREA"].includes(target.tagName) || !!target.isContentEditable;
  }

  window.StepStudioEditorKit = {
    h, escapeHtml, typing,
    STORAGE_KEY: "stepstudio.workflow.current", // the graph being edited (survives a reload)
    SAVED_KEY: "stepstudio.workflow.saved", // workflows saved by name in the browser
    PICTURE_KINDS: ["picture", "mask"], // fields that hold a picture as a data URL
  };
})();
