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
import contextvars
import functools
import importlib.util
import itertools
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
        return segment_attention(query, key, value, self.joint_lengths, self.joint_lengths)


# A group of rows of equal lengths in at most this many runs of consecutive rows attends run by
# run on views of the sequence (the CFG layout puts a shape's negative rows and its positive rows in
# two runs); in more runs, gathered into one batch.
MAX_VIEW_RUNS = 2

KERNELS = ("auto", "varlen", "sdpa", "padded")
# How packed attention runs (the GPU check compares them; the studio always uses "auto"):
#   varlen  flash-attn's flash_attn_varlen_func over every row at once (CUDA, half precision)
#   sdpa    one scaled_dot_product_attention call per run of rows of equal lengths
#   padded  one SDPA call over every row padded to the longest, padding masked out
#   auto    varlen where flash-attn is installed and usable, else sdpa
attention_kernel: contextvars.ContextVar[str] = contextvars.ContextVar("attention_kernel", default="auto")


def segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      query_lengths: Sequence[int], key_lengths: Sequence[int]) -> torch.Tensor:
    """Attention of each row's query tokens to that row's key tokens only: the rows' segments lie end
    to end in `query` ([sum of query_lengths, heads, dim]) and in `key`/`value`. flash-attn's varlen
    kernel on CUDA in half precision; elsewhere one SDPA call per run of rows with equal lengths (a
    batch of those rows, as diffusers' native backend calls it). See `attention_kernel`."""
    kernel = attention_kernel.get()
    varlen = _flash_varlen()
    usable = varlen is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
    if kernel == "varlen" and not usable:
        raise RuntimeError("attention_kernel 'varlen' needs flash-attn installed and a CUDA tensor in fp16/bf16.")
    if kernel == "varlen" or (kernel == "auto" and usable):
        cu_q, cu_k = (F.pad(torch.cumsum(torch.tensor(lengths, device=query.device, dtype=torch.int32), 0,
                                         dtype=torch.int32), (1, 0)) for lengths in (query_lengths, key_lengths))
        return varlen(query, key, value, cu_q, cu_k, max(query_lengths), max(key_lengths))
    if kernel == "padded":
        return _padded_attention(query, key, value, query_lengths, key_lengths)
    q_starts = [0] + list(itertools.accumulate(query_lengths))[:-1]
    k_starts = [0] + list(itertools.accumulate(key_lengths))[:-1]
    groups: dict[tuple[int, int], list[int]] = {}
    for row, lengths in enumerate(zip(query_lengths, key_lengths)):
        groups.setdefault(lengths, []).append(row)
    out = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for (q_length, k_length), rows in groups.items():
        runs = _consecutive(rows)
        if len(runs) <= MAX_VIEW_RUNS:
            # Rows side by side (a CFG request's two rows, requests of one size sorted together, a
            # forward of equal rows): one call per run on views, no gathering.
            for first, count in runs:
                q_run = slice(q_starts[first], q_starts[first] + count * q_length)
                k_run = slice(k_starts[first], k_starts[first] + count * k_length)
                q, k, v = (t[run].view(count, length, *t.shape[1:]).transpose(1, 2)  # [rows, heads, length, dim]
                           for t, run, length in ((query, q_run, q_length), (key, k_run, k_length), (value, k_run, k_length)))
                out[q_run] = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(out[q_run].shape)
            continue
        q_index, k_index = (_runs([starts[r] for r in rows], length, query.device)
                            for starts, length in ((q_starts, q_length), (k_starts, k_length)))
        q = query.index_select(0, q_index).view(len(rows), q_length, *query.shape[1:]).transpose(1, 2)
        k, v = (t.index_select(0, k_index).view(len(rows), k_length, *t.shape[1:]).transpose(1, 2) for t in (key, value))
        attended = F.scaled_dot_product_attention(q, k, v)
        out.index_copy_(0, q_index, attended.transpose(1, 2).reshape(len(q_index), *out.shape[1:]))
    return out


def _padded_attention(query, key, value, query_lengths: Sequence[int], key_lengths: Sequence[int]) -> torch.Tensor:
    """Every row padded to the longest, in one masked SDPA call (what a stacked forward of different
    sizes would have to do): exact, but it computes every row at the largest row's length."""
    rows, longest_q, longest_k = len(query_lengths), max(query_lengths), max(key_lengths)

    def padded(tensor, lengths, longest):
        out = tensor.new_zeros((rows, longest) + tuple(tensor.shape[1:]))
        for row, part in enumerate(tensor.split(list(lengths))):
            out[row, : len(part)] = part
        return out.transpose(1, 2)  # [rows, heads, length, dim]

    q, k, v = padded(query, query_lengths, longest_q), padded(key, key_lengths, longest_k), padded(value, key_lengths, longest_k)
    keep = torch.arange(longest_k, device=query.device)[None, :] < torch.tensor(list(key_lengths), device=query.device)[:, None]
    attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :]).transpose(1, 2)
    return torch.cat([attended[row, :length] for row, length in enumerate(query_lengths)])


def _consecutive(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending row numbers as runs of consecutive rows: (first row, count) each."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][0] + runs[-1][1] == row:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((row, 1))
    return runs


def _runs(starts: Sequence[int], length: int, device) -> torch.Tensor:
    """The token indices of runs of `length` tokens beginning at `starts`, run after run."""
    return (torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)[None, :]).flatten()


@dataclass(frozen=True)
class PackedStreams:
    """A family's packed block inputs by kind (what the step cache needs to take rows apart)."""

    image: str = "hidden_states"  # [image tokens, ...]
    text: str | None = "encoder_hidden_states"  # [text tokens, ...]
    per_row: tuple[str, ...] = ("temb",)  # [rows, ...]
    per_joint_token: tuple[str, ...] = ("image_rotary_emb",)  # tuples of [joint tokens, ...] tensors
    per_image_token: tuple[str, ...] = ()  # tuples of [image tokens, ...] tensors


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
        for kind, names in (("joint", self.streams.per_joint_token), ("image", self.streams.per_image_token)):
            if names:
                tokens = self.packing.tokens(kind, rows)
                for name in names:
                    subset[name] = tuple(part.index_select(0, tokens) for part in values[name])
        return subset


@dataclass(frozen=True)
class PackedModel:
    """What a family file says about its packed forward (pipelines/flux_packed.py, wan_packed.py)."""

    forward: Callable  # (model, model rows, TokenScope, blocks_runner) -> one prediction per row
    run_blocks: Callable[[Sequence, dict], dict]  # every block in turn over the block inputs
    modulated_input: Callable  # (first block, block inputs) -> its modulated input (TeaCache's signal)
    first_block: Callable  # model -> its first block
    streams: PackedStreams  # the block inputs by kind, for the step cache

    def blocks_runner(self, denoiser, run):
        """How the forward runs its blocks: in turn, or through a step cache's per-request `run`
        (pipelines/step_cache.CachedRun)."""
        if run is None:
            return self.run_blocks
        first = self.first_block(denoiser)

        def cached(blocks: Sequence, values: dict) -> dict:
            return run(blocks, values, PackedRows(values["packing"], self.streams),
                       lambda inputs: self.modulated_input(first, inputs))

        return cached
