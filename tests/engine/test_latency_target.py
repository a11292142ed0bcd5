"""The latency target (``EngineConfig.itl_target_ms``) in the engine: validated, defaulted
by usage, and never changing greedy outputs."""
import pytest

from paged_core import LLM, SamplingParams
from paged_core.config import EngineConfig
from paged_core.core.step_cost import StepCostModel
from paged_core.core.step_pacer import StepPacer


def test_itl_target_is_validated_and_defaults_by_usage():
    with pytest.raises(ValueError, match="itl_target_ms"):
        EngineConfig(itl_target_ms=-1)
    assert EngineConfig.from_env({"PAGED_CORE_ITL_TARGET_MS": "80"}).itl_target_ms == 80.0


def test_latency_target_keeps_greedy_outputs(tokenizer, tmp_path, monkeypatch):
    """Steps cut to a tiny time budget give the same tokens as unbounded steps: once a
    sequence decodes, prompts advance a few tokens per step beside the decodes instead of
    ``max_num_batched_tokens`` (64)."""
    from ..reference import passage_token_ids
    from ..tiny_models import build_tiny_model

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=9 * i) for i, n in enumerate([5, 90, 60, 130])]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    plain.shutdown()
    bounded = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64,
                  itl_target_ms=1)
    engine = bounded.engine
    cost = StepCostModel()  # forget what start-up calibration measured
    cost.observe(1, 1, 0.0005)
    cost.observe(1, 101, 0.0105)  # "1 token takes 0.1 ms": room for ~5 tokens
    monkeypatch.setattr(cost, "observe", lambda *step: None)  # keep that cost
    monkeypatch.setattr(StepPacer, "cost", property(lambda pacer: cost))  # whatever the team
    sizes = []
    schedule = engine.core.scheduler.schedule

    def recording_schedule(step_budget=None):
        decoding = engine.core.scheduler.num_decodes_in_flight > 0
        out = schedule(step_budget)
        sizes.append(out.num_tokens if decoding else None)
        return out

    engine.core.scheduler.schedule = recording_schedule
    got = [o.outputs[0].token_ids for o in bounded.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    bounded_sizes = [n for n in sizes if n is not None]  # steps that carry decodes
    assert len(bounded_sizes) > 10 and max(bounded_sizes) <= 6  # 1 ms: 0.4 fixed + 6 of 0.1
