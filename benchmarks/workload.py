"""Seeded serving workloads: who sends which request when, and which ones get cancelled.

Two runs with the same arguments send exactly the same requests in the same order. A video
workload (`frames_mix` given) also draws each request's frame count, after everything an
image workload draws, so an image workload is the same with or without this option.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

Kind = Literal["closed", "open"]

_FALLBACK_VIDEO_PROMPTS = (
    "a red circle moving left on a blue background",
    "a green square moving up on a black background",
)
_FALLBACK_PROMPTS = (
    "a large red circle on a blue background, left",
    "a small yellow square on a black background, center",
    "a large green triangle on a white background, top",
    "a small purple circle on an orange background, right",
)


@dataclass(frozen=True)
class WorkItem:
    index: int
    user: int  # closed loop: the user who sends it (each user sends its items in order)
    arrival_s: float  # open loop: seconds after the start when it arrives
    prompt: str
    steps: int
    size: int  # width (and height, unless `height` says otherwise)
    seed: int
    cancel_after_step: int | None  # cancel once this many steps are done (None: never)
    frames: int | None = None  # a video's frame count (None: an image)
    height: int | None = None  # None: square (`size` x `size`)

    @property
    def width_height(self) -> tuple[int, int]:
        return self.size, self.height or self.size


@dataclass(frozen=True)
class Workload:
    kind: Kind
    users: int
    rate_per_s: float
    items: tuple[WorkItem, ...]
    guidance_scale: float | None = None  # None: the model's default (e.g. true CFG)

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "users": self.users, "rate_per_s": self.rate_per_s,
                           "items": [asdict(i) for i in self.items], "guidance_scale": self.guidance_scale})

    @classmethod
    def from_json(cls, text: str) -> "Workload":
        data = json.loads(text)
        return cls(data["kind"], data["users"], data["rate_per_s"], tuple(WorkItem(**i) for i in data["items"]),
                   data.get("guidance_scale"))


def shape_prompts(count: int, seed: int) -> list[str]:
    """Prompts from the built-in model's world when it is importable, else a fixed few."""
    try:
        from tools.shapes_world import example_prompts

        return list(example_prompts(count, seed))
    except ImportError:
        return [_FALLBACK_PROMPTS[i % len(_FALLBACK_PROMPTS)] for i in range(count)]


def moving_shape_prompts(count: int, seed: int) -> list[str]:
    """Prompts from the built-in video model's world when it is importable, else a fixed few."""
    try:
        from tools.moving_shapes_world import example_prompts

        return list(example_prompts(count, seed))
    except ImportError:
        return [_FALLBACK_VIDEO_PROMPTS[i % len(_FALLBACK_VIDEO_PROMPTS)] for i in range(count)]


def make_workload(
    kind: Kind,
    num_requests: int,
    users: int,
    rate_per_s: float,
    steps_mix: tuple[int, ...],
    sizes: tuple[int | tuple[int, int], ...],
    cancel_fraction: float,
    seed: int,
    arrivals: Literal["poisson", "fixed"] = "poisson",
    guidance_scale: float | None = None,
    frames_mix: tuple[int, ...] = (),
    prompts: list[str] | None = None,
) -> Workload:
    """`sizes`: square sides, or (width, height) pairs; `prompts`: the requests' prompts, in order
    (None: the built-in worlds' examples)."""
    if num_requests < 1 or users < 1:
        raise ValueError(f"num_requests={num_requests} and users={users} must both be at least 1.")
    if not 0.0 <= cancel_fraction < 1.0:
        raise ValueError(f"cancel_fraction={cancel_fraction} must be in [0, 1).")
    rng = random.Random(seed)
    if prompts is None:
        prompts = moving_shape_prompts(num_requests, seed) if frames_mix else shape_prompts(num_requests, seed)
    items, clock = [], 0.0
    for index in range(num_requests):
        steps = rng.choice(steps_mix)
        cancel = rng.random() < cancel_fraction
        item = WorkItem(
            index=index,
            user=index % users,
            arrival_s=round(clock, 6),
            prompt=prompts[index].lower(),
            steps=steps,
            size=0,
            seed=0,
            cancel_after_step=max(1, steps // 2) if cancel else None,
        )
        size = rng.choice(sizes)
        width, height = size if isinstance(size, tuple) else (size, None)
        item = replace(item, size=width, height=height, seed=rng.randrange(2**31))
        items.append(replace(item, frames=rng.choice(frames_mix)) if frames_mix else item)
        if kind == "open":
            clock += rng.expovariate(rate_per_s) if arrivals == "poisson" else 1.0 / rate_per_s
    return Workload(kind=kind, users=users, rate_per_s=rate_per_s, items=tuple(items), guidance_scale=guidance_scale)


def save(workload: Workload, path: Path) -> None:
    path.write_text(workload.to_json())
