/* The editor's keyboard shortcuts (a part of studio/page/web/node_editor.js), all in one table.
 *
 * None of them fires while the editor is hidden (another tab of the page) or while the mask
 * painter is open, and none but Run and Cancel while a key goes into a text field (a node's
 * prompt, the search box, a group's title): as in ComfyUI, Ctrl+Enter in a prompt runs the graph,
 * while Ctrl+A, Ctrl+C, Delete... stay the field's. Ctrl+Alt+Enter cancels as in ComfyUI:
 * Ctrl+Shift+Enter there means "run first".
 */
(function () {
  "use strict";

  // [key, ctrl, shift, alt, what it does]; ctrl is Ctrl or Cmd; null: either.
  const SHORTCUTS = [
    ["enter", true, false, false, (e) => e.run(), { inFields: true }],
    ["enter", true, null, true, (e) => e.cancelRun(), { inFields: true }],
    ["z", true, false, false, (e) => e.undo()],
    ["z", true, true, false, (e) => e.redo()],
    ["y", true, false, false, (e) => e.redo()],
    ["c", true, false, false, (e) => e.clipboard.copy(), { keepDefault: true }], // the copy event follows
    ["x", true, false, false, (e) => e.clipboard.copy() && e.selection.remove(), { keepDefault: true }],
    ["v", true, false, false, (e) => e.clipboard.requestPaste(), { keepDefault: true }], // the paste event follows
    ["d", true, false, false, (e) => e.clipboard.duplicate()],
    ["a", true, false, false, (e) => e.selection.selectAll()],
    ["g", true, false, false, (e) => e.groups.around(e.selection.selected())],
    ["b", true, false, false, (e) => e.bypass.toggle(e.selection.selected())],
    ["delete", false, null, false, (e) => e.selection.remove()],
    ["backspace", false, null, false, (e) => e.selection.remove()],
    ["escape", false, null, false, (e) => e.toggleHelp(false) || (e.fullScreen.on ? e.fullScreen.toggle(false) : e.selection.set([]))],
  ];

  function matches([key, ctrl, shift, alt], event) {
    return event.key.toLowerCase() === key && (event.ctrlKey || event.metaKey) === ctrl &&
           (shift === null || event.shiftKey === shift) && event.altKey === alt;
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    window.addEventListener("keydown", (event) => {
      const shown = editor.root.isConnected && editor.root.getClientRects().length > 0;
      if (!shown || editor.root.querySelector(".sse-paint-overlay")) return;
      const shortcut = SHORTCUTS.find((s) => matches(s, event));
      if (!shortcut) return;
      const options = shortcut[5] || {};
      if (kit.typing(event) && !(options.inFields && editor.root.contains(event.target))) return;
      if (!options.keepDefault) event.preventDefault();
      shortcut[4](editor);
    }, true); // before drawflow's own Delete on its canvas: one removal, one undo entry
  });
})();
