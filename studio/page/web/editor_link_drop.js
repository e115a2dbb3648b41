/* Links dropped away from a port (a part of studio/page/web/node_editor.js).
 *
 * A link dragged from an output and dropped on empty canvas opens the node search (editor_search.js)
 * with only the nodes that take it; the chosen node is added there and linked. Dropped on a node's
 * body, it joins that node's first free input that takes it. A link can also start from a free
 * input (drawflow starts links from outputs only): dropped on an output it links, on empty canvas
 * it opens the search with the nodes that make what the input takes (a Sweep already set to it).
 *
 * Pressed on an input that has a link, the link comes off it and follows the mouse from its output,
 * as in ComfyUI: from there on it is drawflow's own drag from that output (above), and the link's
 * removal is one undo entry with whatever the drop makes (dropped where it came from, nothing changes;
 * on empty canvas with the search closed unused, the link is gone).
 */
(function () {
  "use strict";

  const MOVED_PX = 8; // less than this between press and release is a click, not a drag

  const portIndex = (el) => parseInt(el.classList[1].split("_")[1], 10) - 1; // "output_2" -> 1
  const nodeIdOf = (el) => el.closest(".drawflow-node").id.slice(5);

  class LinkDrop {
    constructor(editor, kit) {
      this.editor = editor;
      this.df = editor.df;
      this.h = kit.h;
      editor.canvas.addEventListener("mouseup", (e) => this.noteDrop(e), true);
      this.df.on("connectionCancel", () => this.onCancel());
      editor.canvas.parentElement.addEventListener("mousedown", (e) => this.fromInput(e), true);
      window.addEventListener("mouseup", () => this.afterLift()); // after drawflow's own mouseup
    }

    // What lies under a point, the link being dragged left out.
    under(x, y) {
      const dragged = this.df.connection_ele;
      return document.elementsFromPoint(x, y).find((el) => !(dragged && dragged.contains(el))) || null;
    }

    // ------------------------------------------------------------------ from an output (drawflow's drag)
    noteDrop(event) {
      // Capture phase: runs before drawflow's mouseup, while its dragged link is still known.
      this.drop = null;
      const df = this.df;
      if (!df.connection || !df.ele_selected || !df.ele_selected.classList.contains("output")) return;
      if (Math.hypot(event.clientX - df.pos_x_start, event.clientY - df.pos_y_start) < MOVED_PX) return;
      const target = this.under(event.clientX, event.clientY);
      if (!target || target.closest(".input")) return; // drawflow links it (or refuses it)
      const port = df.ele_selected, node = nodeIdOf(port), index = portIndex(port);
      const type = this.editor.outputType(node, index);
      const onNode = target.closest(".drawflow-node");
      this.drop = { x: event.clientX, y: event.clientY, node, index, type,
                    onNode: onNode ? onNode.id.slice(5) : null, background: this.editor.onBackground(target) };
    }

    onCancel() {
      const drop = this.drop;
      this.drop = null;
      if (!drop || !drop.type) return;
      if (drop.onNode && drop.onNode !== drop.node) this.linkToFreeInput(drop);
      else if (drop.background) {
        // A lifted link's removal is kept with what the search adds (or committed when it closes unused).
        const onEnd = this.lifted ? () => this.editor.changed() : null;
        this.lifted = false;
        this.editor.search.open({ x: drop.x, y: drop.y, link: { from: "output", node: drop.node, index: drop.index, type: drop.type },
                                  onEnd });
      }
    }

    linkToFreeInput(drop) {
      const editor = this.editor, target = editor.nodeData(drop.onNode);
      const spec = editor.types[target.name];
      const index = spec.inputs.findIndex((port, i) =>
        editor.accepts(drop.onNode, i, drop.type) && !target.inputs["input_" + (i + 1)].connections.length);
      if (index < 0) { editor.say(`${spec.title} has no free input that takes ${drop.type}.`, "error"); return; }
      this.df.addConnection(drop.node, drop.onNode, "output_" + (drop.index + 1), "input_" + (index + 1));
    }

    // ------------------------------------------------------------------ from an input (our own drag)
    fromInput(event) {
      const port = event.button === 0 && event.target.closest && event.target.closest(".drawflow-node .input");
      if (!port || !this.editor.canvas.contains(port)) return;
      const node = nodeIdOf(port), index = portIndex(port);
      const linked = this.editor.nodeData(node).inputs["input_" + (index + 1)].connections;
      if (linked.length) { this.lift(event, node, index, linked[0]); return; }
      event.stopPropagation();
      event.preventDefault();
      const spec = this.editor.types[this.editor.nodeData(node).name].inputs[index];
      const accepts = spec.accepts || [spec.type];
      const canvas = this.editor.canvas, origin = canvas.getBoundingClientRect();
      const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
      const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
      svg.setAttribute("class", "sse-rubber");
      svg.appendChild(path);
      canvas.appendChild(svg);
      const box = port.getBoundingClientRect();
      const sx = box.left + box.width / 2 - origin.left, sy = box.top + box.height / 2 - origin.top;
      const move = (e) => {
        const ex = e.clientX - origin.left, ey = e.clientY - origin.top, bend = Math.abs(ex - sx) * 0.4;
        path.setAttribute("d", `M ${sx} ${sy} C ${sx - bend} ${sy} ${ex + bend} ${ey} ${ex} ${ey}`);
      };
      const up = (e) => {
        window.removeEventListener("mousemove", move);
        window.removeEventListener("mouseup", up, true);
        svg.remove();
        if (Math.hypot(e.clientX - event.clientX, e.clientY - event.clientY) < MOVED_PX) return;
        const target = document.elementFromPoint(e.clientX, e.clientY);
        const output = target && target.closest(".drawflow-node .output");
        const onNode = target && target.closest(".drawflow-node");
        if (output) this.df.addConnection(nodeIdOf(output), node, output.classList[1], "input_" + (index + 1));
        else if (onNode && onNode.id.slice(5) !== node) this.linkFromOutput(onNode.id.slice(5), node, index, accepts);
        else if (target && this.editor.onBackground(target)) {
          this.editor.search.open({ x: e.clientX, y: e.clientY, link: { from: "input", node, index, accepts } });
        }
      };
      move(event);
      window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", up, true);
    }

    // ------------------------------------------------------------------ a linked input: lift its link
    lift(event, node, index, link) {
      const editor = this.editor, df = this.df;
      const output = editor.nodeElement(link.node) && editor.nodeElement(link.node).querySelector(".outputs ." + link.input);
      if (!output) return;
      event.stopPropagation(); // drawflow's mousedown would take the press for the node
      event.preventDefault();
      editor.quiet++; // no undo entry yet: the drop makes the rest of this one
      try { df.removeSingleConnection(link.node, node, link.input, "input_" + (index + 1)); } finally { editor.quiet--; }
      this.lifted = true;
      // drawflow's state as if the press had been on the output (its mousedown on an output does this).
      const { clientX: x, clientY: y } = event;
      Object.assign(df, { ele_selected: output, connection: true, pos_x: x, pos_y: y, pos_x_start: x, pos_y_start: y,
                          mouse_x: x, mouse_y: y });
      df.drawConnection(output);
      df.updateConnection(x, y);
    }

    afterLift() {
      if (!this.lifted) return;
      this.lifted = false;
      const df = this.df;
      if (df.connection) { // released off the canvas, where drawflow never heard it: the link stays off
        if (df.connection_ele) df.connection_ele.remove();
        Object.assign(df, { connection: false, connection_ele: null });
      }
      this.editor.changed(); // the removal, unless the drop's own edit committed it already
    }

    linkFromOutput(source, node, index, accepts) {
      const editor = this.editor, spec = editor.types[editor.nodeData(source).name];
      const output = spec.outputs.findIndex((port, i) => accepts.includes(editor.outputType(source, i)));
      if (output < 0) { editor.say(`${spec.title} makes no ${accepts.join(" or ")}.`, "error"); return; }
      this.df.addConnection(source, node, "output_" + (output + 1), "input_" + (index + 1));
    }
  }

  (window.StepStudioEditorParts = window.StepStudioEditorParts || []).push((editor, kit) => {
    editor.linkDrop = new LinkDrop(editor, kit);
  });
})();
