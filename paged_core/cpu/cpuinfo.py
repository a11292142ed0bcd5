"""This machine's CPU as ``/proc/cpuinfo`` describes it (Linux; empty elsewhere)."""
from __future__ import annotations

import functools


def first_cpu_fields() -> dict[str, str]:
    """The first processor's ``key: value`` lines of ``/proc/cpuinfo`` ({} without /proc),
    read once per process (each call gets its own copy)."""
    return dict(_first_cpu_fields())


@functools.lru_cache(maxsize=None)
def _first_cpu_fields() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the end of the first processor's stanza
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:  # no /proc (not Linux)
        pass
    return fields


def cpu_vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``; ``""`` where unknown); read
    from the cached fields without a copy (every ``cpu_paged_attention`` call left to its
    default KV prefetch policy asks)."""
    return _first_cpu_fields().get("vendor_id", "")
