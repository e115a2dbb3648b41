"""pipelines/cpu_memory.py: once a pipeline has loaded, a forward-sized CPU tensor lands on pages
the process already touched (no page faults), forward after forward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cpu_memory import keep_freed_cpu_memory

ROOT = Path(__file__).resolve().parent.parent

# Page faults are counted per process (getrusage counts every thread), so they are measured in a
# fresh one: threads that earlier tests left running in a test worker fault pages of their own.
MEASURE = """
import resource, torch
from pipelines.cpu_memory import keep_freed_cpu_memory
torch.set_num_threads(1)
applied = keep_freed_cpu_memory()
def forward():
    # 8 x 5 MB alive at once, then freed, as a forward's activations: glibc's default hands the
    # freed heap top (40 MB, over its trim threshold) back to the kernel, to be faulted in again
    activations = [torch.ones(2000, 640) for _ in range(8)]
    return sum(a.sum() for a in activations)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    forward()
per_forward = []
for _ in range(21):
    before = faults()
    forward()
    per_forward.append(faults() - before)
# the median and the total: with freed memory kept the heap still grows now and then by a block (a
# one-off 1,250 faults); glibc's default faults each forward's 40 MB in again (10,000 faults) until
# its own sliding thresholds happen to settle, if they do
print(applied, sorted(per_forward)[10], sum(per_forward))
"""


def _faults_per_forward(keep: str) -> tuple[str, int, int]:
    env = {**os.environ, "STEPSTUDIO_KEEP_FREED_MEMORY": keep}
    out = subprocess.run([sys.executable, "-c", MEASURE], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_activations_are_reused_without_page_faults():
    applied, median, _ = _faults_per_forward("1")
    assert applied == "True"
    assert median < 5
    # the measure sees faults: glibc's default faulted 40 MB in at least twice in 21 forwards
    applied, _, total = _faults_per_forward("0")
    assert applied == "False"
    assert total > 20_000


def test_it_can_be_turned_off(monkeypatch):
    keep_freed_cpu_memory.cache_clear()
    monkeypatch.setenv("STEPSTUDIO_KEEP_FREED_MEMORY", "0")
    try:
        assert keep_freed_cpu_memory() is False
    finally:
        keep_freed_cpu_memory.cache_clear()
