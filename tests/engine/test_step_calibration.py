"""Calibrating the latency target's step-cost model at start-up (``engine.step_calibration``):
the shapes it times, why it matters (a fresh server's slow first steps), and that an engine
with a target does it before its first request without leaving a trace in the KV cache."""
import pytest

from paged_core import LLM, SamplingParams
from paged_core.core.kv_cache_manager import KVCacheManager
from paged_core.core.step_cost import StepCostModel, latency_budget
from paged_core.engine.step_calibration import calibration_batch, calibration_shapes

# A fresh LitServe server's first steps, as a burst of 100 came in over HTTP on the same 2
# cores (Intel Xeon, amx_bf16; seconds measured): the bench's two 16-token warm-up requests,
# then prompt steps 5-8x slower than their size costs on a quiet machine.
COLD_BURST_STEPS = [(2, 32, 0.0248), (2, 2, 0.0140), (2, 54, 0.1107), (4, 99, 0.0887),
                    (4, 80, 0.0850)]
# What calibration timed on that machine before the server took requests.
CALIBRATION_STEPS = [(1, 1, 0.0098), (16, 16, 0.0121), (1, 256, 0.0412), (4, 1024, 0.1390)]


def _prompt_budgets(first_steps, then_steps) -> list[int]:
    """The prompt tokens a 150 ms target lets in beside 4 decodes after each of ``then_steps``."""
    model = StepCostModel()
    for step in first_steps:
        model.observe(*step)
    budgets = []
    for step in then_steps:
        model.observe(*step)
        budgets.append(latency_budget(model, 0.150, 4).prompt_tokens)
    return budgets


def test_calibration_keeps_slow_first_steps_from_shrinking_every_step():
    uncalibrated = _prompt_budgets([], COLD_BURST_STEPS)[3:]  # once the slow steps are its pace
    calibrated = _prompt_budgets(CALIBRATION_STEPS, COLD_BURST_STEPS)[2:]
    assert max(uncalibrated) < 150  # a token "costs" ~1 ms: steps of ~100 tokens
    assert min(calibrated) > 500  # the 1024-token step anchors the slope at ~0.1 ms a token


@pytest.mark.parametrize("max_num_seqs, max_num_batched_tokens, max_model_len", [
    (128, 2048, 8192), (4, 2048, 8192), (128, 100, 8192), (128, 2048, 64), (2, 32, 20)])
def test_calibration_shapes_stay_within_the_engine_limits(max_num_seqs, max_num_batched_tokens,
                                                          max_model_len):
    shapes = calibration_shapes(max_num_seqs, max_num_batched_tokens, max_model_len)
    assert shapes[0] == [(1, 1)]  # a lone decode
    assert all(new == 1 for new, _ in shapes[1])  # a batch of decodes
    for shape in shapes:
        assert 1 <= len(shape) <= max_num_seqs
        assert sum(new for new, _ in shape) <= max_num_batched_tokens
        assert all(1 <= new <= context <= max_model_len for new, context in shape)
    largest = sum(new for new, _ in shapes[-1])
    assert largest == min(1024, max_num_batched_tokens, max_num_seqs * min(256, max_model_len,
                                                                           max_num_batched_tokens))


@pytest.mark.parametrize("bucketed", [False, True])
def test_calibration_batch_maps_every_token_to_block_zero(bucketed):
    packed = calibration_batch([(41, 41), (1, 70), (23, 23)], block_size=16, bucketed=bucketed)
    assert packed.num_tokens == 65 and packed.num_seqs == 3
    assert len(packed.input_ids) == (72 if bucketed else 65)  # 65 tokens bucket to 72 rows
    real = packed.slot_mapping[:packed.num_tokens]
    assert ((0 <= real) & (real < 16)).all() and (packed.slot_mapping[65:] == -1).all()
    assert (packed.block_tables == 0).all() and list(packed.seq_lens) == [41, 70, 23]
    assert list(packed.logits_indices) == [40, 41, 64]


# the families whose forward differs most: LongRoPE's long rotary rows, Gemma 2's sliding
# window and soft cap, a mixture of experts
@pytest.mark.parametrize("model_type,dtype", [("llama", "float32"), ("phi3-longrope", "bfloat16"),
                                              ("gemma2", "bfloat16"), ("qwen3_moe", "bfloat16")])
def test_an_engine_with_a_latency_target_calibrates_before_its_first_request(tokenizer, tmp_path,
                                                                             model_type, dtype):
    """The fit is known before any request, nothing in the KV cache shows it, and the tokens
    are those of an engine without a target (block 0 was written by calibration)."""
    from ..reference import passage_token_ids
    from ..tiny_models import build_tiny_model

    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer)
    prompts = [passage_token_ids(tokenizer, n, offset=7 * i) for i, n in enumerate([30, 75])]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = LLM(model=folder, dtype=dtype, num_kv_blocks=32)
    assert plain.engine.core.pacer.cost.per_row_s is None  # no target: nothing to calibrate
    expected = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    plain.shutdown()

    paced = LLM(model=folder, dtype=dtype, num_kv_blocks=32, itl_target_ms=150)
    core = paced.engine.core
    assert core.pacer.cost.per_row_s > 0 and core.pacer.cost.fixed_s is not None
    untouched = KVCacheManager(core.kv.num_blocks, core.config.block_size,
                               core.config.enable_prefix_caching).stats()
    assert core.kv.stats() == untouched
    got = [o.outputs[0].token_ids for o in paced.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    paced.shutdown()
