"""OpenMP worker threads that stay awake between the short ops of one step.

A decode step of a small batch is a few hundred short parallel ops (four linears,
attention and the fused elementwise ops per layer). With ``OMP_WAIT_POLICY=PASSIVE``
(what shared machines and this project's tests use) libgomp puts every worker
thread to sleep the moment an op ends, and waking it for the next op costs tens of
microseconds: for one sequence on a 2-core AVX512-BF16 EPYC that was 17.6 ms a
token, against 9.3 ms with the bounded spin below (11.3 ms fully ``ACTIVE``).

``GOMP_SPINCOUNT`` bounds the busy wait instead: a thread spins for that many
iterations (tens of microseconds; libgomp honours it over ``OMP_WAIT_POLICY``)
before sleeping, so back-to-back ops find it awake while an idle engine still
gives its cores back. libgomp reads it once, when it is loaded by the first
``import torch``: importing ``paged_core`` first sets it (unless the user did),
and every process the engine starts (TP workers, servers) inherits it.
"""
from __future__ import annotations

import os
import sys

DEFAULT_SPINCOUNT = "100000"


def keep_threads_awake_between_ops() -> bool:
    """Set ``GOMP_SPINCOUNT`` (unless set) if libgomp is not loaded yet; True if it takes effect."""
    if "torch" in sys.modules:
        return False  # libgomp already read its settings
    os.environ.setdefault("GOMP_SPINCOUNT", DEFAULT_SPINCOUNT)
    return True
