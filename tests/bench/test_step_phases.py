"""``PhaseTimer`` (behind ``bench steps``): every step split into phases that add up to its
wall time, each phase measured where it runs, and the engine left as it was."""
import time

from paged_core import SamplingParams
from paged_core.bench.step_phases import PHASES, PhaseTimer
from paged_core.sample.sampler import Sampler

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea, there"]


def _generate(engine, tag: str) -> tuple[list[list[int]], list[float]]:
    """Greedy 6 tokens for each prompt, stepping by hand; returns the tokens and each step's wall time."""
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(engine.make_request(f"{tag}-{i}", prompt,
                                               SamplingParams(max_tokens=6, temperature=0)))
    finished, walls = {}, []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        outputs = engine.step()
        walls.append(time.perf_counter() - start)
        finished.update({out.request_id: out for out in outputs if out.finished})
    return [finished[f"{tag}-{i}"].outputs[0].token_ids for i in range(len(PROMPTS))], walls


def test_phases_add_up_to_each_step_and_the_engine_is_restored(llm_fp32):
    engine = llm_fp32.engine
    worker, model = engine.core.executor.worker, engine.core.executor.runner.model
    sampler = worker.sampler
    untimed, _ = _generate(engine, "plain")
    with PhaseTimer(engine) as timer:
        timed, walls = _generate(engine, "timed")
    assert timed == untimed  # timing changes nothing the engine computes
    assert len(timer.steps) == len(walls) == 6
    for record, wall in zip(timer.steps, walls):
        assert set(record.seconds) == set(PHASES)
        # Layers run as one C++ call time their attention inside forward.
        untimed_phases = {"other"} | ({"attention"} if model.decoder_stack is not None else set())
        assert all(record.seconds[p] > 0 for p in PHASES if p not in untimed_phases)
        assert wall - 0.05 <= record.total_s <= wall  # only the call into step() is outside
        assert record.num_seqs == 2 and record.num_rows >= record.num_tokens
    first, *rest = timer.steps
    prompt_tokens = sum(len(engine.tokenizer.encode(p)) for p in PROMPTS)
    assert first.kind == "mixed" and first.num_tokens == prompt_tokens
    assert all(r.kind == "decode" and r.num_tokens == 2 for r in rest)
    # The context each step's attention reads: the prompts, then one more token a sequence.
    assert first.num_context_tokens == prompt_tokens
    assert [r.num_context_tokens for r in rest] == [prompt_tokens + 2 * i for i in range(1, 6)]
    assert worker.sampler is sampler and isinstance(worker.sampler, Sampler)
    core, backend = engine.core, engine.core.executor.runner.backend
    for owner, name in ((engine, "step"), (core, "pack"), (core, "plan_sampling"),
                        (core, "execute_model"), (core, "update_from_output"),
                        (engine.output_processor, "process_outputs"),
                        (core.scheduler, "schedule"), (model, "forward"), (model, "compute_logits"),
                        (backend, "write_kv"), (backend, "attend")):
        assert name not in vars(owner), f"{name} is still wrapped"


def test_size_groups_are_powers_of_two():
    from paged_core.bench.steps import size_group

    assert [size_group(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [
        "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "33-64", "65-128"]
