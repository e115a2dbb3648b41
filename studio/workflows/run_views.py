"""A workflow run as its callers see it at one moment: immutable views of each branch (its
request's tracker status), of each node (the state of the branches it takes part in) and of the
whole run. `WorkflowRun` (`studio.workflows.run`) makes them; the page draws them.
Pure: imports neither gradio nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PIL import Image

from engine import Completed, GenerationParams
from studio.tracker import ABORTED, COMPLETED, FAILED, FINAL_STATES, QUEUED, RUNNING, WAITING, Status
from studio.workflows.branches import Branch
from studio.workflows.ports import PortType


@dataclass(frozen=True)
class BranchView:
    """One branch as the run knows it at one moment: its request's tracker status."""

    branch: Branch
    params: GenerationParams  # complete: defaults and seed resolved
    status: Status

    @property
    def state(self) -> str:
        return self.status.state

    @property
    def step(self) -> int:
        return self.status.step

    @property
    def total(self) -> int:
        return self.status.total

    @property
    def position(self) -> int | None:
        return self.status.position

    @property
    def paused(self) -> str:
        """While queued: why it waits ("session": the tab's queue is paused; "engine": all are)."""
        return self.status.paused

    @property
    def batch_size(self) -> int:
        return self.status.batch_size

    @property
    def message(self) -> str:
        return self.status.message

    @property
    def request_id(self) -> str | None:
        return self.status.request_id

    @property
    def preview(self) -> object:
        """The latest preview (a PIL image, or a list of frames for video)."""
        return self.status.preview

    @property
    def result(self) -> Completed | None:
        return self.status.result

    @property
    def is_finished(self) -> bool:
        return self.status.is_final

    @property
    def caption(self) -> str:
        """What tells this branch's result from its siblings': every swept value, then the seed
        (unless the seed is one of them): "steps 10, guidance 3 · seed 7"."""
        return result_caption(self.branch, self.params.seed)


@dataclass(frozen=True)
class NodeRunState:
    """A workflow node's part in a run (what the editor colours the node by)."""

    state: str  # "idle" | "waiting" | "running" | "done" | "partial" | "aborted" | "error" (the run's words)
    done: int  # branches of this node that ended
    total: int


@dataclass(frozen=True)
class RunView:
    """The run after a batch of events (an immutable snapshot)."""

    run_id: str
    state: str  # "running" | "completed" | "aborted" | "failed" | "partial"
    done: int
    total: int
    branches: tuple[BranchView, ...]
    nodes: dict[str, NodeRunState]
    grids: dict[str, Image.Image] = field(default_factory=dict)

    @property
    def is_final(self) -> bool:
        return self.state != RUNNING


def node_state(branches: list[BranchView]) -> NodeRunState:
    """A node's state from its branches: running while any is, then how they ended."""
    if not branches:
        return NodeRunState("idle", 0, 0)
    states = [b.state for b in branches]
    done = sum(state in FINAL_STATES for state in states)
    if done < len(states):
        active = any(state in (QUEUED, RUNNING) for state in states)
        return NodeRunState(RUNNING if active else WAITING, done, len(states))
    if FAILED in states:
        return NodeRunState("error", done, len(states))
    if ABORTED in states:  # the run's words: "partial" when some finished, "aborted" when none did
        return NodeRunState("partial" if COMPLETED in states else ABORTED, done, len(states))
    return NodeRunState("done", done, len(states))


def result_caption(branch: Branch, seed: int | None) -> str:
    """A branch's swept values and its seed: "steps 10, guidance 3 · seed 7"; "seed 7" for a
    branch without fan-outs; "seed 12, guidance 2.5" when the seed is swept itself."""
    swept = ", ".join(f"{axis.input} {axis.label}" for axis in branch.axes)
    if seed is None or any(axis.input == PortType.SEED for axis in branch.axes):
        return swept or "single"
    return f"{swept} · seed {seed}" if swept else f"seed {seed}"


def result_image(progress: BranchView) -> Image.Image | None:
    """The branch's finished image (for a video: its middle frame)."""
    if progress.result is None:
        return None
    images = progress.result.images
    return images[len(images) // 2] if progress.result.is_video else images[0]


def cell_word(progress: BranchView) -> str:
    """What an empty grid cell says (grids are drawn again only when a branch ends)."""
    return progress.state if progress.is_finished else "in progress"
