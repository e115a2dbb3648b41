"""PromptEmbeddingCache: one batched text-encoder call for the missing texts, LRU eviction."""

import pytest

from pipelines.prompt_cache import PromptEmbeddingCache


class CountingEncoder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> list[str]:
        self.calls.append(list(texts))
        return [f"embedding of {text}" for text in texts]


def test_missing_texts_are_encoded_together_once_each_and_returned_in_order():
    encoder = CountingEncoder()
    cache = PromptEmbeddingCache(encoder)
    entries = cache.encode_many(["a red circle", "", "a blue square", ""])
    assert entries == ["embedding of a red circle", "embedding of ", "embedding of a blue square", "embedding of "]
    assert encoder.calls == [["a red circle", "", "a blue square"]]
    assert (cache.misses, cache.hits, cache.batched_calls) == (3, 1, 1)


def test_cached_texts_are_not_encoded_again():
    encoder = CountingEncoder()
    cache = PromptEmbeddingCache(encoder)
    cache.encode_many(["a red circle", ""])
    assert cache.encode_many(["a green star", ""]) == ["embedding of a green star", "embedding of "]
    assert cache.encode("a red circle") == "embedding of a red circle"
    assert encoder.calls == [["a red circle", ""], ["a green star"]]
    assert (cache.misses, cache.hits, cache.batched_calls) == (3, 2, 2)


def test_least_recently_used_text_is_evicted_first():
    encoder = CountingEncoder()
    cache = PromptEmbeddingCache(encoder, capacity=2)
    cache.encode_many(["a", "b"])
    cache.encode("a")  # "b" is now the least recently used
    cache.encode("c")
    assert len(cache) == 2
    cache.encode_many(["a", "c"])
    assert encoder.calls == [["a", "b"], ["c"]]
    cache.encode("b")
    assert encoder.calls[-1] == ["b"]


def test_capacity_zero_still_batches_but_keeps_nothing():
    encoder = CountingEncoder()
    cache = PromptEmbeddingCache(encoder, capacity=0)
    cache.encode_many(["a", "b", "a"])
    cache.encode("a")
    assert encoder.calls == [["a", "b"], ["a"]]
    assert len(cache) == 0


def test_an_encoder_returning_the_wrong_number_of_entries_is_an_error():
    cache = PromptEmbeddingCache(lambda texts: ["only one"])
    with pytest.raises(RuntimeError, match="encoding 2 texts returned 1 entries"):
        cache.encode_many(["a", "b"])
    assert len(cache) == 0


def test_negative_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity=-1"):
        PromptEmbeddingCache(CountingEncoder(), capacity=-1)


def test_resize_keeps_the_most_recently_used_texts():
    encoder = CountingEncoder()
    cache = PromptEmbeddingCache(encoder, capacity=4)
    cache.encode_many(["a", "b", "c"])
    cache.encode("a")  # order of use: b, c, a
    cache.resize(2)
    assert (cache.capacity, len(cache)) == (2, 2)
    cache.encode_many(["c", "a"])
    assert encoder.calls == [["a", "b", "c"]]
    cache.encode("b")
    assert encoder.calls[-1] == ["b"]
    with pytest.raises(ValueError, match="capacity=-3"):
        cache.resize(-3)


def test_split_rows_copies_each_row_out_of_the_batch():
    import torch

    from pipelines.prompt_cache import split_rows

    embeds, pooled = torch.arange(24.0).reshape(3, 4, 2), torch.arange(6.0).reshape(3, 2)
    rows = split_rows(3, embeds, pooled)
    assert len(rows) == 3 and all(len(row) == 2 for row in rows)
    assert torch.equal(rows[1][0], embeds[1:2]) and torch.equal(rows[2][1], pooled[2:3])
    assert rows[1][0].untyped_storage().nbytes() == 8 * 4  # one row of 4x2 float32, not the batch
    embeds[1] = -1.0
    assert rows[1][0].min() >= 0  # a copy: later writes to the batch don't reach it
