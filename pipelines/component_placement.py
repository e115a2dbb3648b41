"""Where a pipeline's text encoders and VAE live between uses: on the device, or in host memory.

Under the `offload` memory plans (pipelines/memory_plan.py) the denoiser stays on the device and
the other components ("text_encoders", "vae") wait in host memory: a use brings its group to the
device and, outside an engine stage, sends it back right after.

A step engine must not move a component per request: the encodes of the requests joining a step
and the decodes of the requests that finished it come between two denoise forwards. So the
engine runs each of those phases inside `stage()` (engine/runner.py): a group brought to the
device during a stage stays there until the stage ends, so it moves at most once per encode or
decode group, however many requests the group holds. `moves` counts every trip to the device.

The host copy of every weight is kept (pinned on CUDA, for fast asynchronous copies), and a
trip back to the host only drops the device copy: the weights never change while serving.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterator

import torch


class _HostCopy:
    """One module's parameters and buffers, kept in host memory, swapped onto the device and back."""

    def __init__(self, module: torch.nn.Module, pin: bool) -> None:
        self.slots: list[tuple[torch.Tensor, torch.Tensor]] = []  # (the module's tensor, its host copy)
        for tensor in [*module.parameters(), *module.buffers()]:
            host = tensor.data.to("cpu")
            if pin:
                host = host.pin_memory()
            tensor.data = host
            self.slots.append((tensor, host))

    def to_device(self, device: torch.device) -> None:
        for tensor, host in self.slots:
            tensor.data = host.to(device, non_blocking=True)

    def to_host(self) -> None:
        for tensor, host in self.slots:
            tensor.data = host


class ComponentPlacement:
    """The offloaded component groups of one pipeline (empty: everything stays where it is)."""

    def __init__(self, device: torch.device, groups: dict[str, list[torch.nn.Module]] | None = None) -> None:
        self.device = device
        pin = device.type == "cuda"
        self._groups = {name: [_HostCopy(module, pin) for module in modules]
                        for name, modules in (groups or {}).items() if modules}
        self._on_device: set[str] = set()
        self._stage_depth = 0
        self.moves: Counter[str] = Counter()  # group -> trips to the device

    @property
    def offloaded(self) -> tuple[str, ...]:
        return tuple(self._groups)

    @contextlib.contextmanager
    def using(self, group: str) -> Iterator[None]:
        """`group` is on the device inside the block (a no-op for a group that is not offloaded)."""
        if group not in self._groups:
            yield
            return
        if group not in self._on_device:
            try:
                for copy in self._groups[group]:
                    copy.to_device(self.device)
            except BaseException:  # out of memory midway: drop what did arrive, keep the host copies
                for copy in self._groups[group]:
                    copy.to_host()
                raise
            self._on_device.add(group)
            self.moves[group] += 1
        try:
            yield
        finally:
            if self._stage_depth == 0:
                self._send_back(group)

    @contextlib.contextmanager
    def stage(self) -> Iterator[None]:
        """Groups brought to the device inside the block stay there until it ends."""
        self._stage_depth += 1
        try:
            yield
        finally:
            self._stage_depth -= 1
            if self._stage_depth == 0:
                for group in tuple(self._on_device):
                    self._send_back(group)

    def _send_back(self, group: str) -> None:
        if group in self._on_device:
            for copy in self._groups[group]:
                copy.to_host()
            self._on_device.discard(group)
