"""numpy's OpenBLAS held to one thread while the engine's own numpy work runs.

The step-cost model refits a three-term least squares every step (``np.linalg.lstsq``, and
``np.linalg.solve`` for its leverages). numpy's bundled OpenBLAS hands some of those small
calls (``dtrsm`` over a window of 256 steps) to its own worker thread, which then waits for
more work by calling ``sched_yield`` for about 0.1 s (OpenBLAS's busy wait) on one of the
cores the engine's OpenMP team runs on. On 2 cores of an Intel(R) Xeon(R) Processor
(amx_bf16), 2026-12-07, an in-process server at 1 request/s had 13-24 of ~800 one-sequence
steps take 36-125 ms instead of ~12 (their forward at 2 cores of CPU, 30-90 ms of it in the
kernel), and `perf` put that worker's samples in ``sched_yield`` from
``blas_thread_server``. ``single_threaded_blas`` sets OpenBLAS's thread count to 1 for the
body (the call runs on the caller's thread) and restores it after, so a user's own numpy
work in the process keeps its threads. Where numpy's BLAS is not an OpenBLAS this process
has loaded (MKL, Accelerate, no ``/proc``), or an OpenBLAS built on OpenMP (whose thread count
is the calling thread's OpenMP setting, which the engine's team owns), it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator

import numpy  # noqa: F401  (loads numpy's OpenBLAS, which _openblas_calls looks for)

MAPS = "/proc/self/maps"
# OpenBLAS's thread-count calls, as numpy's 64-bit-integer build names them and as others do
_SUFFIXES = ("64_", "")
OPENMP_BUILD = 2  # openblas_get_parallel(): 0 sequential, 1 its own threads, 2 OpenMP


@functools.lru_cache(maxsize=1)
def _openblas_calls() -> tuple | None:
    """(get, set) of the OpenBLAS this process has loaded, or None."""
    try:
        with open(MAPS, encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps
                     if "openblas" in os.path.basename(line.split()[-1]).lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for suffix in _SUFFIXES:
            get = getattr(lib, f"openblas_get_num_threads{suffix}", None)
            set_ = getattr(lib, f"openblas_set_num_threads{suffix}", None)
            parallel = getattr(lib, f"openblas_get_parallel{suffix}", None)
            if parallel is not None:
                parallel.restype, parallel.argtypes = ctypes.c_int, []
                if parallel() == OPENMP_BUILD:  # its count is OpenMP's, the engine's team's
                    return None
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    return None


def openblas_threads() -> int | None:
    """OpenBLAS's thread count now (None: no OpenBLAS loaded)."""
    calls = _openblas_calls()
    return None if calls is None else calls[0]()


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run the body with numpy's OpenBLAS on one thread, the caller's (module doc)."""
    calls = _openblas_calls()
    before = calls[0]() if calls is not None else 1
    if before > 1:
        calls[1](1)
    try:
        yield
    finally:
        if before > 1:
            calls[1](before)
