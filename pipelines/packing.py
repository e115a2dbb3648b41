r"""Packed forwards: rows of different sizes and prompt lengths in one transformer forward.

A co-batched forward normally stacks its rows, so they must share a shape. A packed forward
lays every row's tokens end to end in one sequence instead, one *document* per row:

    text stream   [ t0 t0 t0 | t1 t1 t1 t1 | t2 t2 ]                  (each row's prompt tokens)
    image stream  [ i0 i0 i0 i0 i0 i0 | i1 i1 i1 | i2 i2 i2 i2 i2 i2 i2 i2 ]
    joint         [ t0 t0 t0 i0 i0 i0 i0 i0 i0 | t1 t1 t1 t1 i1 i1 i1 | t2 t2 i2 ... i2 ]
                    \_________ row 0 ________/   \_______ row 1 ______/   \___ row 2 ___/

- Token-wise layers (projections, feed-forwards, norms) run once over all tokens of a stream.
- What a row has once (timestep, pooled text, guidance: the modulation) is computed per row and
  spread to that row's tokens through `text_row` / `image_row` / `joint_row` (token -> row).
- Rotary positions are each row's own (its image ids start at 0 like a solo run's).
- Attention never crosses a row: one attention call per run of equal-length rows on CPU (each a
  batch of those rows, so a forward of equal rows is one call, as before), or flash-attn's varlen
  kernel with `cu_seqlens` over the whole joint sequence on CUDA.

A CFG request's negative row is a row like any other. The family files (pipelines/flux_packed.py)
say how their blocks run on this layout.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Callable, ContextManager, Sequence

import torch
import torch.nn.functional as F

# token -> row map of the stream about to run (None: the forward's rows themselves) -> a context in
# which the row-wise hooks (LoRA deltas, pipelines/lora_rows.py) read that map
TokenScope = Callable[[torch.Tensor | None], ContextManager]


def no_token_scope(token_rows: torch.Tensor | None) -> ContextManager:
    return contextlib.nullcontext()


@functools.lru_cache(maxsize=1)
def _flash_varlen():
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:  # installed but not built for this machine
        return None
    return flash_attn_varlen_func


class Packing:
    """Where each row's text and image tokens lie in the packed streams (see the module docstring)."""

    def __init__(self, text_lengths: Sequence[int], image_lengths: Sequence[int], device: torch.device | str) -> None:
        if len(text_lengths) != len(image_lengths) or not text_lengths:
            raise ValueError(f"a packing needs one text and one image length per row, got "
                             f"{len(text_lengths)} and {len(image_lengths)}.")
        self.text_lengths = tuple(int(n) for n in text_lengths)
        self.image_lengths = tuple(int(n) for n in image_lengths)
        self.device = torch.device(device)
        rows = torch.arange(len(self.text_lengths), device=self.device)
        text = torch.tensor(self.text_lengths, device=self.device)
        image = torch.tensor(self.image_lengths, device=self.device)
        self.text_row = rows.repeat_interleave(text)
        self.image_row = rows.repeat_interleave(image)
        self.joint_row = rows.repeat_interleave(text + image)
        starts = torch.cumsum(text + image, 0) - (text + image)
        self.text_in_joint = torch.cat([starts[r] + torch.arange(n, device=self.device)
                                        for r, n in enumerate(self.text_lengths)])
        self.image_in_joint = torch.cat([starts[r] + self.text_lengths[r] + torch.arange(n, device=self.device)
                                         for r, n in enumerate(self.image_lengths)])
        # Rows grouped by their joint length: one attention call per group on CPU.
        groups: dict[int, list[int]] = {}
        for row, length in enumerate(self.joint_lengths):
            groups.setdefault(length, []).append(row)
        joint_starts = starts.tolist()
        self._groups = [(length, [joint_starts[r] for r in members]) for length, members in groups.items()]

    @property
    def rows(self) -> int:
        return len(self.text_lengths)

    @property
    def joint_lengths(self) -> tuple[int, ...]:
        return tuple(t + i for t, i in zip(self.text_lengths, self.image_lengths))

    @property
    def uniform(self) -> bool:
        """Every row has the same text and image lengths (a stacked forward would do)."""
        return len(set(self.text_lengths)) == 1 and len(set(self.image_lengths)) == 1

    # ------------------------------------------------------------------ layouts
    def join(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        """The two streams ([T_text, ...], [T_image, ...]) as one joint sequence, row by row."""
        joint = text.new_empty((len(self.joint_row),) + tuple(text.shape[1:]))
        joint.index_copy_(0, self.text_in_joint, text)
        joint.index_copy_(0, self.image_in_joint, image)
        return joint

    def split(self, joint: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The inverse of `join`: (text stream, image stream)."""
        return joint.index_select(0, self.text_in_joint), joint.index_select(0, self.image_in_joint)

    def image_rows(self, image: torch.Tensor) -> list[torch.Tensor]:
        """The image stream cut back into rows: one [1, tokens, ...] tensor per row."""
        return [part.unsqueeze(0) for part in image.split(self.image_lengths)]

    def spread(self, per_row: torch.Tensor, token_rows: torch.Tensor) -> torch.Tensor:
        """A per-row value ([rows, ...]) given to each token of a stream ([tokens, ...])."""
        return per_row.index_select(0, token_rows)

    def tokens(self, stream: str, rows: Sequence[int]) -> torch.Tensor:
        """Where these rows' tokens lie in a stream ("text", "image" or "joint"), row after row."""
        token_rows = {"text": self.text_row, "image": self.image_row, "joint": self.joint_row}[stream]
        return torch.cat([torch.nonzero(token_rows == row).flatten() for row in rows])

    def select(self, rows: Sequence[int]) -> "Packing":
        """The packing of a subset of rows, renumbered from 0 in the order given."""
        return Packing([self.text_lengths[r] for r in rows], [self.image_lengths[r] for r in rows], self.device)

    # ------------------------------------------------------------------ attention
    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """Attention within each row's document of the joint sequence ([T_joint, heads, dim] each)."""
        varlen = _flash_varlen()
        if varlen is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
            lengths = torch.tensor(self.joint_lengths, device=query.device, dtype=torch.int32)
            cu_seqlens = F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
            longest = max(self.joint_lengths)
            return varlen(query, key, value, cu_seqlens, cu_seqlens, longest, longest)
        out = torch.empty_like(query)
        for length, starts in self._groups:
            index = (torch.tensor(starts, device=query.device)[:, None]
                     + torch.arange(length, device=query.device)[None, :]).flatten()
            # [rows, heads, length, dim], as diffusers' native backend calls SDPA
            q, k, v = (t.index_select(0, index).view(len(starts), length, *t.shape[1:]).transpose(1, 2)
                       for t in (query, key, value))
            attended = F.scaled_dot_product_attention(q, k, v)
            out.index_copy_(0, index, attended.transpose(1, 2).reshape(len(index), *query.shape[1:]))
        return out


@dataclass(frozen=True)
class PackedStreams:
    """A family's packed block inputs by kind (what the step cache needs to take rows apart)."""

    image: str = "hidden_states"  # [image tokens, ...]
    text: str | None = "encoder_hidden_states"  # [text tokens, ...]
    per_row: tuple[str, ...] = ("temb",)  # [rows, ...]
    per_joint_token: tuple[str, ...] = ("image_rotary_emb",)  # tuples of [joint tokens, ...] tensors


class PackedRows:
    """How a packed forward's block inputs hold their rows (the packed counterpart of
    pipelines/step_cache.StackedRows): a row is a run of tokens in each stream."""

    def __init__(self, packing: Packing, streams: PackedStreams) -> None:
        self.packing, self.streams = packing, streams

    def index(self, name: str, rows: Sequence[int]) -> torch.Tensor:
        """Where these rows lie along the leading dimension of the block input or output `name`."""
        if name == self.streams.image:
            return self.packing.tokens("image", rows)
        if name == self.streams.text:
            return self.packing.tokens("text", rows)
        return torch.tensor(list(rows), device=self.packing.device, dtype=torch.long)

    def subset(self, values: dict, rows: Sequence[int]) -> dict:
        """The block inputs of a packed forward over only these rows."""
        subset = dict(values, packing=self.packing.select(rows))
        for name in (self.streams.image, self.streams.text) + self.streams.per_row:
            if name is not None:
                subset[name] = values[name].index_select(0, self.index(name, rows))
        joint = self.packing.tokens("joint", rows)
        for name in self.streams.per_joint_token:
            subset[name] = tuple(part.index_select(0, joint) for part in values[name])
        return subset
