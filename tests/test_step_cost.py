"""``StepCostModel`` and the latency target it serves (``EngineConfig.itl_target_ms``)."""
import pytest

from paged_core import LLM, SamplingParams
from paged_core.config import EngineConfig
from paged_core.step_cost import StepCostModel


def test_fit_recovers_fixed_and_per_token_cost():
    model = StepCostModel()
    assert model.tokens_within(0.1) is None  # nothing seen yet: no limit
    model.observe(8, 0.010 + 0.001 * 8)
    assert model.tokens_within(0.1) is None  # one size only: the slope is unknown
    for n in (1, 64, 200, 17, 512):
        model.observe(n, 0.010 + 0.001 * n)
    assert model.fixed_s == pytest.approx(0.010) and model.per_token_s == pytest.approx(0.001)
    assert model.tokens_within(0.150) in (139, 140)
    assert model.tokens_within(0.005) == 0


def test_noise_with_a_falling_slope_keeps_the_last_good_fit():
    model = StepCostModel(window=4)
    model.observe(10, 0.02)
    model.observe(100, 0.11)
    good = model.per_token_s
    model.observe(400, 0.01)  # a step that took less than a much smaller one
    model.observe(800, 0.005)
    assert model.per_token_s == good


def test_itl_target_is_validated_and_defaults_by_usage():
    with pytest.raises(ValueError, match="itl_target_ms"):
        EngineConfig(itl_target_ms=-1)
    assert EngineConfig.from_env({"PAGED_CORE_ITL_TARGET_MS": "80"}).itl_target_ms == 80.0


def test_latency_target_keeps_greedy_outputs(tokenizer, tmp_path):
    """Steps cut to a tiny time budget give the same tokens as unbounded steps: once a
    sequence decodes, prompts advance one block (16 tokens) per step beside the decodes
    instead of ``max_num_batched_tokens`` (64); the step cost is learnt from the real steps."""
    from .reference import passage_token_ids
    from .tiny_models import build_tiny_model

    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=9 * i) for i, n in enumerate([5, 90, 60, 130])]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64)
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    plain.shutdown()
    bounded = LLM(model=folder, dtype="float32", num_kv_blocks=64, max_num_batched_tokens=64,
                  itl_target_ms=1)
    engine = bounded.engine
    engine.step_cost.observe(1, 0.0005)
    engine.step_cost.observe(101, 0.0105)  # "1 token takes 0.1 ms": room for ~5 tokens
    sizes = []
    schedule = engine.scheduler.schedule

    def recording_schedule(max_step_tokens=None):
        out = schedule(max_step_tokens)
        sizes.append(out.num_tokens)
        return out

    engine.scheduler.schedule = recording_schedule
    got = [o.outputs[0].token_ids for o in bounded.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert sizes[0] == 64 and max(sizes[1:]) <= len(prompts) + 16
    assert engine.step_cost.per_token_s is not None and engine.step_cost.per_token_s > 0
