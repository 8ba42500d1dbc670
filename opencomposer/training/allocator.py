"""Keep freed memory in the process for the next training step: no mmap per large tensor.

glibc's malloc serves a block above its mmap threshold (adaptive, capped at 32 MiB on 64-bit
Linux) with a fresh mmap and unmaps it on free. A train step allocates several such tensors
every step (the output head's [tokens, vocab] logits and their gradients, the experts' stacked
activations), so each step the kernel maps, zero-fills and page-faults them again: ~10 ms for one
[2020, 4096] fp32 tensor on this project's 2-core host, and a 4 ms exp into it took 14-18 ms
inside a step (docs/benchmarks.md, issue 23). torch's CPU allocator has no cache of its own.

`keep_freed_memory()` sets M_MMAP_MAX = 0 (the heap serves every block; glibc still falls back
to mmap when the heap cannot grow, so nothing fails for it) and a 1 GiB M_TRIM_THRESHOLD (freed
memory stays mapped instead of being returned after each free). Numerics are untouched: the
same bits, only fewer page faults. Peak RSS stays that of the largest step, since the heap
reuses what it keeps. It is process-wide and idempotent; on a C library other than glibc it
does nothing and says so by returning False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the two mallopt settings once per process; True where glibc took them."""
    global _applied
    if _applied is None:
        _applied = _mallopt()
    return _applied


def _mallopt() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
