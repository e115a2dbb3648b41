"""What a workflow keeps for the editor only: groups (titled frames drawn behind nodes) and node
colours. They ride along in the workflow JSON, so a saved, downloaded or re-opened workflow looks
as it was left, and the compiler never reads them.

    {"version": 1, "nodes": [{"id": "1", ..., "color": "#2563eb"}], "links": [...],
     "groups": [{"title": "Axes", "position": [20, 300], "size": [300, 420], "color": "#7c3aed"}]}

A group holds no list of its nodes: the editor moves the nodes that lie inside its frame, as
ComfyUI does. Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_GROUPS = 100
MAX_GROUP_TITLE_CHARS = 200
# A colour is "#rrggbb": what the editor's swatches write, and safe to put into a style.
COLOR = re.compile(r"#[0-9a-fA-F]{6}")


@dataclass(frozen=True)
class Group:
    title: str
    position: tuple[float, float]  # the frame's top-left, in canvas pixels (as node positions are)
    size: tuple[float, float]  # width, height
    color: str | None = None

    def to_json(self) -> dict:
        group = {"title": self.title, "position": list(self.position), "size": list(self.size)}
        if self.color is not None:
            group["color"] = self.color
        return group


def parse_color(raw: object, what: str) -> tuple[str | None, str | None]:
    """(the colour or None, None), or (None, a message saying what is wrong with it)."""
    if raw is None:
        return None, None
    if isinstance(raw, str) and COLOR.fullmatch(raw):
        return raw.lower(), None
    return None, f"{what} color must be \"#rrggbb\" (six hex digits), got {raw!r:.40}."


def _pair(raw: object, positive: bool) -> tuple[float, float] | None:
    if not (isinstance(raw, (list, tuple)) and len(raw) == 2):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) < 1e7 for v in raw):
        return None
    if positive and min(raw) <= 0:
        return None
    return float(raw[0]), float(raw[1])


def parse_groups(raw: object) -> tuple[tuple[Group, ...], list[str]]:
    """The groups of a workflow's "groups" list (absent: none), and a message per thing wrong."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [f"groups must be a JSON list, got {type(raw).__name__}."]
    if len(raw) > MAX_GROUPS:
        return (), [f"the workflow has {len(raw)} groups; at most {MAX_GROUPS} are allowed."]
    groups, problems = [], []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            problems.append(f"group {index} must be a JSON object with title, position and size.")
            continue
        title = item.get("title", "")
        position, size = _pair(item.get("position"), False), _pair(item.get("size"), True)
        color, color_problem = parse_color(item.get("color"), f"group {index}:")
        if not isinstance(title, str) or len(title) > MAX_GROUP_TITLE_CHARS:
            problems.append(f"group {index}: title must be text of at most {MAX_GROUP_TITLE_CHARS} characters, "
                            f"got {title!r:.60}.")
        elif position is None:
            problems.append(f"group {index}: position must be [x, y] in pixels, got {item.get('position')!r:.60}.")
        elif size is None:
            problems.append(f"group {index}: size must be [width, height], both above 0, "
                            f"got {item.get('size')!r:.60}.")
        elif color_problem:
            problems.append(color_problem)
        else:
            groups.append(Group(title, position, size, color))
    return tuple(groups), problems
