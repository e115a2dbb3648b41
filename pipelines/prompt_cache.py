"""Prompt embeddings kept between requests, and encoded together when several are missing.

Text encoding is most of a request's `prepare_encode` on small models (two text encoders,
once for the prompt and once for the negative prompt). Two facts of serving make a cache
pay off:
- the negative prompt is nearly always the model's default (often ""), the same for everyone;
- users re-roll: the same prompt comes back with another seed.
And when several requests join the same engine step, their missing texts go through the
text encoders in ONE batched call instead of one call each (`PromptEmbeddingCache.encode_many`).

The cache holds one entry per text (tensors with a batch dim of 1). Entries are read-only:
a pipeline builds new tensors from them (torch.cat) and never writes into them. A text encoded
with LoRA adapters that change a text encoder is an `AdaptedText`, its own entry; adapters
that change only the denoiser leave the text's entry shared.
"""

from __future__ import annotations

import abc
import threading
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Sequence

DEFAULT_CAPACITY = 32  # texts; a FLUX.1 T5 embedding is ~4 MB in bf16, so ~130 MB at most



class AdaptedText(NamedTuple):
    """A text encoded with text-encoder adapters (pipelines/lora_request.LoraUse, sorted)."""

    text: str
    loras: tuple


PromptKey = str | AdaptedText  # what the cache is keyed by: a plain text, or a text with adapters
EncodeBatch = Callable[[list[PromptKey]], list[Any]]  # keys -> one entry per key, in order


def split_rows(count: int, *batched) -> list[tuple]:
    """One entry per text from batched encoder outputs ([count, ...] tensors): row i of each,
    as its own copy. A view would keep the whole batch's memory alive as long as any one of
    its texts stays cached."""
    return [tuple(tensor[i : i + 1].clone() for tensor in batched) for i in range(count)]


class BatchedPromptEncoder(abc.ABC):
    """`encode_prompts` of the optional protocol (pipelines/interface.py), for a pipeline with
    a `prompt_cache` and a `_texts(params)` that lists what one request encodes."""

    prompt_cache: "PromptEmbeddingCache"

    @abc.abstractmethod
    def _texts(self, params) -> list[str]:
        """Every text one request encodes, as the text encoders see them."""

    def encode_prompts(self, params: Sequence) -> None:
        """The texts of requests joining the same step, through the text encoders in one call."""
        self.prompt_cache.encode_many([text for p in params for text in self._texts(p)])


class PromptEmbeddingCache:
    """Text -> its embeddings, least recently used evicted first.

    `encode_batch(texts)` is the model's batched text encoding; it must return one entry
    per text, in order, each equal to what encoding that text alone gives."""

    def __init__(self, encode_batch: EncodeBatch, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"capacity={capacity} must be 0 (no cache) or more.")
        self._encode_batch = encode_batch
        self.capacity = capacity
        self._entries: OrderedDict[str, Any] = OrderedDict()
        # The engine thread is the only writer; the lock keeps other threads' reads consistent.
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.batched_calls = 0  # text-encoder calls made for misses

    def __len__(self) -> int:
        return len(self._entries)

    def encode_many(self, texts: Sequence[str]) -> list[Any]:
        """Entries for `texts`, in order. Every text not cached (each distinct one once) is
        encoded in a single `encode_batch` call."""
        found: dict[str, Any] = {}
        with self._lock:
            for text in texts:
                if text in self._entries and text not in found:
                    self._entries.move_to_end(text)
                    found[text] = self._entries[text]
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            entries = self._encode_batch(missing)
            if len(entries) != len(missing):
                raise RuntimeError(f"encoding {len(missing)} texts returned {len(entries)} entries.")
            found.update(zip(missing, entries))
            self._store(zip(missing, entries))
        with self._lock:
            self.batched_calls += bool(missing)
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
        return [found[text] for text in texts]

    def encode(self, text: str) -> Any:
        return self.encode_many([text])[0]

    def resize(self, capacity: int) -> None:
        """Keep at most `capacity` texts from now on (0: keep none), evicting the oldest."""
        if capacity < 0:
            raise ValueError(f"capacity={capacity} must be 0 (no cache) or more.")
        with self._lock:
            self.capacity = capacity
            while len(self._entries) > capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _store(self, items) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            for text, entry in items:
                self._entries[text] = entry
                self._entries.move_to_end(text)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
