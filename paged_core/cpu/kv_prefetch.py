"""How the ``avx512_bf16`` decode attention starts a chunk's K and V into L2:
``PAGED_CORE_CPU_KV_PREFETCH``.

A decode reads each KV block's K rows and V rows as two runs (2 KiB each for head_dim 64 in
blocks of 16) at random places, a few chunks after asking for them
(``attention_decode_bf16.h``). Two ways to ask, the same bits either way (a prefetch moves
no data the kernel computes with):

- ``every_line``: a software prefetch of every line of both runs, dealt out in shares over
  the value pair steps of an earlier chunk. AMD's cores need it: on a Zen 4 the lines in one
  burst read 1.12-1.65x the GB/s of the first line only, and the shares 1.14-1.68x the burst
  (cold KV).
- ``first_line``: a prefetch of each run's first line, which sets Intel's L2 stream
  prefetcher on the rest; every line's prefetches would hold the few fill buffers a core
  has, which the stream prefetcher does not need. On an Intel Xeon with AMX (family 6 model
  167) it read 1.11-1.31x the GB/s of every line (cold KV), 1.28-1.39x with the KV in cache.

``auto`` (the default) takes ``first_line`` on Intel CPUs (``vendor_id`` ``GenuineIntel``)
and ``every_line`` on the others. The setting is read on every call, so each new engine (and
each ``cpu_paged_attention`` call left to its default) sees the current value.
"""
from __future__ import annotations

import os

from .cpuinfo import cpu_vendor

SETTING = "PAGED_CORE_CPU_KV_PREFETCH"
POLICIES = ("every_line", "first_line")


def selected_kv_prefetch() -> str:
    """The policy ``PAGED_CORE_CPU_KV_PREFETCH`` picks (``auto`` or unset: by CPU vendor);
    raises ``ValueError`` naming the setting for a value it does not know."""
    raw = os.environ.get(SETTING, "").strip().lower()
    if raw in ("", "auto"):
        return "first_line" if cpu_vendor() == "GenuineIntel" else "every_line"
    if raw not in POLICIES:
        raise ValueError(f"{SETTING}={raw!r} is not a KV prefetch policy; choose auto or one of "
                         f"{', '.join(POLICIES)}")
    return raw


def kv_first_line(policy: str | None = None) -> bool:
    """The C++ kernels' ``kv_first_line`` argument for ``policy`` (default: the selected one);
    raises ``ValueError`` for a policy that is not one of ``POLICIES``."""
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"kv_prefetch={policy!r} is not a KV prefetch policy; choose one of "
                         f"{', '.join(POLICIES)}")
    return (policy or selected_kv_prefetch()) == "first_line"
