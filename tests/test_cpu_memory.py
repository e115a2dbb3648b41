"""pipelines/cpu_memory.py: once a pipeline has loaded, a forward-sized CPU tensor lands on pages
the process already touched (no page faults), forward after forward."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from pipelines.cpu_memory import keep_freed_cpu_memory


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_activations_are_reused_without_page_faults():
    assert keep_freed_cpu_memory() is True
    for _ in range(3):
        torch.ones(2000, 640).sum()  # 5 MB, over glibc's default mmap threshold
    before = _faults()
    for _ in range(20):
        torch.ones(2000, 640).sum()
    # glibc's default maps each of them afresh: about 125 faults apiece measured here
    assert (_faults() - before) / 20 < 5


def test_it_can_be_turned_off(monkeypatch):
    keep_freed_cpu_memory.cache_clear()
    monkeypatch.setenv("STEPSTUDIO_KEEP_FREED_MEMORY", "0")
    try:
        assert keep_freed_cpu_memory() is False
    finally:
        keep_freed_cpu_memory.cache_clear()
