/* The run on the nodes (methods of NodeEditor, studio/page/web/node_editor.js): Python streams the
 * run's state through the `run_state` prop; each node shows its state and branches (step bars,
 * previews, results, the grid), the run bar the totals, and a workflow with problems shows them on
 * the nodes it names.
 */
(function () {
  "use strict";

  const { h, escapeHtml } = window.StepStudioEditorKit;

  class EditorRunView {
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
  }

  (window.StepStudioEditorMethods = window.StepStudioEditorMethods || []).push(EditorRunView);
})();
