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

Importing torch first (``import torch`` above ``import paged_core``, a common order) is too
late: libgomp has read ``OMP_WAIT_POLICY=PASSIVE`` without a spin count, and a one-sequence
decode step of the embedded model took 12.2-13.5 ms instead of 6.1-8.0 (2-core AMD EPYC Zen 5,
AVX512-BF16). ``threads_sleep_reason`` says so, and an engine on the CPU logs it once
(``warn_if_threads_sleep``), with the two ways out.
"""
from __future__ import annotations

import functools
import logging
import os
import sys

logger = logging.getLogger(__name__)

DEFAULT_SPINCOUNT = "100000"
_set_in_time = False  # this process set GOMP_SPINCOUNT before libgomp read it


def keep_threads_awake_between_ops() -> bool:
    """Set ``GOMP_SPINCOUNT`` (unless set) if libgomp is not loaded yet; True if it takes effect."""
    global _set_in_time
    if "torch" in sys.modules:
        return False  # libgomp already read its settings
    os.environ.setdefault("GOMP_SPINCOUNT", DEFAULT_SPINCOUNT)
    _set_in_time = True
    return True


def threads_sleep_reason() -> str | None:
    """Why this process's OpenMP threads sleep the moment each op ends (torch was loaded
    before paged_core, under ``OMP_WAIT_POLICY=PASSIVE`` with no ``GOMP_SPINCOUNT``), and
    what to do; None when they spin between ops (libgomp's default without a policy, a
    user's spin count, or the bounded spin set in time)."""
    if _set_in_time or "GOMP_SPINCOUNT" in os.environ:
        return None
    if os.environ.get("OMP_WAIT_POLICY", "").strip().lower() != "passive":
        return None
    return ("torch was imported before paged_core under OMP_WAIT_POLICY=PASSIVE, so OpenMP "
            "threads sleep between the short ops of every step: CPU decode of small batches "
            "runs up to about 2x slower. Import paged_core before torch, or set "
            f"GOMP_SPINCOUNT={DEFAULT_SPINCOUNT} in the environment before Python starts.")


@functools.lru_cache(maxsize=1)
def warn_if_threads_sleep() -> None:
    """Log ``threads_sleep_reason`` once per process, if there is one (CPU engines call this)."""
    reason = threads_sleep_reason()
    if reason is not None:
        logger.warning("%s", reason)
