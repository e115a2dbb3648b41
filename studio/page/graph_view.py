"""The pipeline graph view: each model's stages as an SVG flow with live counts and mean times.

prompt -> text encode -> denoise (xK) -> decode -> image, drawn from `PipelineInfo.stages`, one
row per loaded model (labelled with its name when there are several). Each node shows how many
of that model's requests are at that stage now and the stage's mean time for that model from
`EngineSnapshot.stats.stages_by_model` (`stats.stages` for a single-model engine); the nodes holding the viewer's own requests are highlighted.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass

from engine import EngineSnapshot, RequestView, StageStats
from pipelines.interface import PipelineInfo
from studio.page.queue_view import format_step_time
from studio.queue_snapshot import Viewer, is_viewers

NODE_W, NODE_H, GAP, MARGIN, LABEL_H = 128, 78, 34, 8, 16

GRAPH_CSS = """
.ss-graph svg { width: 100%; height: auto; max-height: 280px; font-family: var(--font); }
.ss-graph .ss-node rect { fill: var(--block-background-fill); stroke: var(--border-color-primary); stroke-width: 1.5; }
.ss-graph .ss-node.ss-busy rect { stroke: var(--color-accent); }
.ss-graph .ss-node.ss-you rect { fill: var(--color-accent-soft); stroke: var(--color-accent); stroke-width: 3; }
.ss-graph text { fill: var(--body-text-color); font-size: 12px; text-anchor: middle; }
.ss-graph text.ss-title { font-weight: 700; font-size: 13px; }
.ss-graph text.ss-you-label { fill: var(--color-accent); font-weight: 700; }
.ss-graph text.ss-model-label { text-anchor: start; font-weight: 700; font-size: 12px; }
.ss-graph .ss-edge { stroke: var(--body-text-color-subdued); stroke-width: 1.5; marker-end: url(#ss-arrow); }
.ss-graph #ss-arrow path { fill: var(--body-text-color-subdued); }
"""


@dataclass(frozen=True)
class NodeView:
    stage: str
    title: str
    count: int  # requests at this stage now (for the media stage: finished so far)
    count_label: str
    mean_s: float | None
    mean_label: str
    viewer_detail: str | None  # e.g. "you: 3/8" when the viewer has a request here


def stage_of(view: RequestView) -> str:
    """Where a live request is in the pipeline now."""
    if view.state == "waiting":
        return "prompt"
    if view.step <= 0:
        return "encode"
    if view.step < view.total:
        return "denoise"
    return "decode"


def _denoise_title(views: list[RequestView]) -> str:
    """'denoise ×20' with the step counts of the requests denoising now (a range when they differ)."""
    totals = sorted({view.total for view in views if view.total})
    if not totals:
        return "denoise"
    return f"denoise ×{totals[0]}" if len(totals) == 1 else f"denoise ×{totals[0]}–{totals[-1]}"


def _title(stage: str, info: PipelineInfo, denoising: list[RequestView]) -> str:
    titles = {
        "prompt": "prompt",
        "encode": "text encode",
        "denoise": _denoise_title(denoising),
        "decode": "decode",
        "media": info.output_kind,
    }
    return titles.get(stage, stage)


def build_nodes(snapshot: EngineSnapshot, info: PipelineInfo, viewer_session: Viewer,
                model: str | None = None) -> list[NodeView]:
    """The nodes of one model's row (`model` None: every request, for a single-model engine)."""
    requests = [view for view in snapshot.requests if model is None or view.model == model]
    counts = Counter(stage_of(view) for view in requests)
    mine = [view for view in requests if is_viewers(view, viewer_session)]
    denoising = [view for view in requests if stage_of(view) == "denoise"]
    # A model's row shows that model's own times (an image and a video model differ a lot).
    stages = snapshot.stats.stages if model is None else snapshot.stats.stages_by_model.get(model, StageStats())
    means = {
        "encode": (stages.encode_s, "mean"),
        "denoise": (stages.denoise_step_s, "per step"),
        "decode": (stages.decode_s, "mean"),
    }
    nodes = []
    for stage in info.stages:
        if stage == "media":
            count = (snapshot.stats.finished.get("completed", 0) if model is None
                     else snapshot.stats.completed_by_model.get(model, 0))
            count_label = f"{count} made"
        else:
            count = counts.get(stage, 0)
            count_label = "waiting: " + str(count) if stage == "prompt" else f"{count} here"
        mean_s, mean_kind = means.get(stage, (None, ""))
        mean_text = format_step_time(mean_s) if mean_s is not None else ""
        mine_here = [view for view in mine if stage_of(view) == stage] if stage != "media" else []
        detail = None
        if mine_here:
            view = mine_here[0]
            detail = f"you: {view.step}/{view.total}" if stage == "denoise" else (
                f"you: #{view.position}" if stage == "prompt" and view.position else "you"
            )
        nodes.append(
            NodeView(
                stage=stage,
                title=_title(stage, info, denoising),
                count=count,
                count_label=count_label,
                mean_s=mean_s,
                mean_label=f"{mean_text} {mean_kind}" if mean_text else "",
                viewer_detail=detail,
            )
        )
    return nodes


def _node_svg(node: NodeView, x: int) -> str:
    classes = ["ss-node", f"ss-stage-{html.escape(node.stage)}"]
    if node.count and node.stage != "media":
        classes.append("ss-busy")
    if node.viewer_detail:
        classes.append("ss-you")
    cx = x + NODE_W // 2
    lines = [
        f'<text class="ss-title" x="{cx}" y="{MARGIN + 20}">{html.escape(node.title)}</text>',
        f'<text class="ss-count" x="{cx}" y="{MARGIN + 37}">{html.escape(node.count_label)}</text>',
    ]
    if node.mean_label:
        lines.append(f'<text class="ss-mean" x="{cx}" y="{MARGIN + 53}">{html.escape(node.mean_label)}</text>')
    if node.viewer_detail:
        lines.append(f'<text class="ss-you-label" x="{cx}" y="{MARGIN + 69}">{html.escape(node.viewer_detail)}</text>')
    return (
        f'<g class="{" ".join(classes)}" data-stage="{html.escape(node.stage)}" data-count="{node.count}">'
        f'<rect x="{x}" y="{MARGIN}" width="{NODE_W}" height="{NODE_H}" rx="10"/>' + "".join(lines) + "</g>"
    )


def _row_svg(nodes: list[NodeView], top: int) -> list[str]:
    parts = []
    for index, node in enumerate(nodes):
        x = MARGIN + index * (NODE_W + GAP)
        if index:
            y = top + MARGIN + NODE_H // 2
            parts.append(f'<line class="ss-edge" x1="{x - GAP + 2}" y1="{y}" x2="{x - 3}" y2="{y}"/>')
        parts.append(f'<g transform="translate(0,{top})">' + _node_svg(node, x) + "</g>")
    return parts


def render_graph(snapshot: EngineSnapshot, infos: PipelineInfo | dict[str, PipelineInfo],
                 viewer_session: Viewer) -> str:
    """The pipeline graph as inline SVG (wrapped in a div for styling): one row per model."""
    if isinstance(infos, PipelineInfo):
        infos = {infos.name: infos}
    rows = list(infos.items()) if len(infos) > 1 else [(None, next(iter(infos.values())))]
    label_h = 0 if len(rows) == 1 else LABEL_H
    row_h = label_h + 2 * MARGIN + NODE_H
    widest = max(len(info.stages) for _, info in rows)
    width = 2 * MARGIN + widest * NODE_W + max(widest - 1, 0) * GAP
    parts = [
        (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {row_h * len(rows)}" role="img" '
         f'aria-label="pipeline graph">'),
        ('<defs><marker id="ss-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
         'orient="auto"><path d="M0,0 L10,5 L0,10 z"/></marker></defs>'),
    ]
    for index, (model, info) in enumerate(rows):
        top = index * row_h
        if label_h:
            parts.append(f'<text class="ss-model-label" x="{MARGIN}" y="{top + label_h - 4}">{html.escape(model)}</text>')
        parts.append(f'<g class="ss-model-row" data-model="{html.escape(model or "")}">')
        parts.extend(_row_svg(build_nodes(snapshot, info, viewer_session, model), top + label_h))
        parts.append("</g>")
    parts.append("</svg>")
    return '<div class="ss-graph">' + "".join(parts) + "</div>"
