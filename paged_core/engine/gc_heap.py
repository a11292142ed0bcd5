"""Keeping Python's cyclic garbage collector off the objects an engine holds for its life.

Loading a model leaves millions of tracked objects behind (the tokenizer's vocabulary,
transformers' and torch's modules, the engine's tables). Each step allocates enough
short-lived objects to trigger collections, and every collection of the oldest generation
walks all of those long-lived objects again, finding nothing: on a 2-core CPU it took 5-8%
of a long-tailed offline run's samples (``perf``; ``gc_collect_main`` and its visitors).
vLLM's engine core does the same at the end of its start-up.
"""
from __future__ import annotations

import atexit
import gc


def freeze_startup_heap() -> None:
    """Collect what start-up left as garbage, then move every object still alive into the
    permanent generation (``gc.freeze``), which collections skip. Invariant: objects created
    afterwards (requests, outputs) are collected as usual; frozen ones are freed by reference
    counting when released, only cycles among them stay until ``gc.unfreeze``, which runs at
    exit so that the interpreter's last collection still frees them (extensions such as
    nanobind's report objects alive at that point as leaks)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many engines a process starts
    atexit.register(gc.unfreeze)
