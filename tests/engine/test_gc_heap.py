"""An engine's start-up freezes the objects it leaves alive (``engine/gc_heap.py``): the
cyclic collector skips them afterwards, yet still frees the cycles that steps create."""
import gc
import weakref

from paged_core import SamplingParams


class _Node:
    pass


def test_start_up_freezes_the_engines_objects_and_later_cycles_are_still_collected(llm_fp32):
    engine = llm_fp32.engine
    assert gc.get_freeze_count() > 100_000  # the tokenizer, modules and tables of the engine
    assert not gc.is_tracked(engine) or engine not in gc.get_objects(generation=2)
    outputs = llm_fp32.generate(["The capital of France is"], SamplingParams(max_tokens=3, temperature=0))
    assert len(outputs[0].outputs[0].token_ids) == 3
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
