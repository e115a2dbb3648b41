"""Freed CPU memory kept for the next forward, instead of handed back to the kernel.

glibc's malloc serves a block over its mmap threshold (128 KiB at start, raised as mmapped blocks
are freed) with a fresh mmap and unmaps it at free, and trims the heap's free top past its trim
threshold (twice the mmap threshold). A forward's activations are such blocks, freed together at its
end, so each forward's tensors land on fresh pages: one page fault per 4 KiB on first touch
(tests/test_cpu_memory.py: eight 5 MB tensors alive at once fault about 10,000 pages per round with
glibc's defaults, none with this). Measured here on the built-in model (one thread, 16 rows of six sizes in one packed
forward, activations up to 5 MB): the single blocks' `torch.cat` took 1.9 ms where the same copy
into touched memory takes 0.4 ms, and the whole packed forward ran 15-20% faster with freed memory
kept. PyTorch's CPU performance guide answers this with jemalloc or tcmalloc through LD_PRELOAD;
this asks glibc itself (no package to install): `mallopt` raises the mmap threshold to glibc's
maximum (32 MiB, so blocks below it come from the heap and are reused) and the trim threshold
(so the heap keeps what a forward freed). The cost: the process keeps its peak heap.

Applied once per process when a pipeline loads (pipelines/loader.py). Elsewhere than Linux with
glibc it does nothing; `STEPSTUDIO_KEEP_FREED_MEMORY=0` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest allowed on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 1 << 30


@functools.lru_cache(maxsize=1)
def keep_freed_cpu_memory() -> bool:
    """Tell glibc to keep freed blocks for reuse (see the module docstring). Whether it applied."""
    if os.environ.get("STEPSTUDIO_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):  # musl and others: leave them be
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
