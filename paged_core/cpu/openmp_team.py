"""Handing a thread's OpenMP workers back once another thread runs the engine's steps.

libgomp keeps a team of worker threads for every thread that has opened a parallel region,
and counts the workers of all teams together; once threads outnumber the CPUs it stops
spinning between regions (its "throttled" spin count, 0 under ``OMP_WAIT_POLICY=PASSIVE``)
whatever ``GOMP_SPINCOUNT`` says (``openmp_spin``), so every one of a step's few hundred
short parallel ops waits for a sleeping worker to wake. ``AsyncEngine`` builds its engine on
the caller's thread (loading runs parallel ops, so that thread keeps a team) and steps it on
a thread of its own (a second team): one-sequence decode of the embedded model took 13-15
ms a token there against 7.5-8.5 ms on the thread that built it, and a server's ITL showed
the same (2-core AMD EPYC Zen 5, avx512_bf16, ``OMP_WAIT_POLICY=PASSIVE`` with the bounded
spin). ``release_openmp_team`` ends the calling thread's team (OpenMP 5's
``omp_pause_resource_all``, soft: a later parallel op on that thread starts a new one), so
the stepping thread's team is the only one: 9.4-9.6 ms, same machine.
"""
from __future__ import annotations

import ctypes
import os

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the calling thread's resources, keep the runtime


def release_openmp_team() -> bool:
    """End the calling thread's OpenMP worker team, if torch's OpenMP is libgomp (the one
    loaded as ``libgomp.so.1``) and this thread is not inside a parallel region; True if it
    did (or had none). False where that OpenMP is not loaded or lacks the call (e.g. Intel's
    ``libiomp5``): nothing changes there."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    pause = getattr(gomp, "omp_pause_resource_all", None)
    if pause is None:
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(OMP_PAUSE_SOFT) == 0
