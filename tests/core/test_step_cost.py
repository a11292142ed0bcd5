"""``StepCostModel`` and ``latency_budget``: the step-time fit the latency target uses
(pure; the engine's use of them is in ``tests/engine/test_latency_target.py``)."""
import numpy as np
import pytest

from paged_core.core.scheduler import StepBudget
from paged_core.core.step_cost import PROMPT_PROGRESS_SHARE, StepCostModel, latency_budget


def test_fit_separates_per_sequence_from_per_token_cost():
    def cost(seqs, tokens):
        return 0.010 + 0.002 * seqs + 0.001 * tokens

    model = StepCostModel()
    assert model.decodes_within(0.1) is None and model.prompt_tokens_within(0.1, 4) is None
    model.observe(1, 8, cost(1, 8))
    assert model.decodes_within(0.1) is None  # one size only: the slopes are unknown
    for seqs, tokens in ((1, 512), (64, 64), (8, 200), (17, 17), (30, 300)):
        model.observe(seqs, tokens, cost(seqs, tokens))
    assert model.fixed_s == pytest.approx(0.010)
    assert model.per_sequence_s == pytest.approx(0.002) and model.per_row_s == pytest.approx(0.001)
    assert model.decodes_within(0.150) in (46, 47)  # 0.010 + 0.003 * 46.67
    # beside 20 decodes (0.070 s) one more prompt pays 0.002, leaving 0.078 s: 78 tokens
    assert model.prompt_tokens_within(0.150, 20) in (77, 78)
    assert model.prompt_tokens_within(0.050, 20) == 0


def test_decode_heavy_steps_are_not_underestimated_by_prefill_steps():
    """One slope fitted on a mix sees the cheap prompt tokens and lets too many decodes in."""
    steps = [(1, 400), (2, 600), (40, 40), (60, 75), (80, 80)]
    times = [0.010 + 0.0015 * seqs + 0.0005 * tokens for seqs, tokens in steps]
    model = StepCostModel()
    for (seqs, tokens), seconds in zip(steps, times):
        model.observe(seqs, tokens, seconds)
    decodes = model.decodes_within(0.150)  # a decode step really costs 0.010 + 0.002 * n
    assert decodes in (69, 70)
    per_token, fixed = np.polyfit([tokens for _, tokens in steps], times, 1)
    assert (0.150 - fixed) / per_token > 1.5 * decodes  # what one slope would have allowed


def test_steps_that_cannot_separate_the_terms_fall_back_to_one_slope():
    model = StepCostModel()
    for n in (1, 64, 200, 17, 512):  # one sequence per token: pure decode steps
        model.observe(n, n, 0.010 + 0.003 * n)
    assert model.per_sequence_s == 0 and model.per_row_s == pytest.approx(0.003)
    assert model.decodes_within(0.150) in (46, 47)
    assert model.prompt_tokens_within(0.005, 0) == 0


def test_noisy_steps_are_sized_for_nine_in_ten_to_meet_the_target():
    quiet, noisy = StepCostModel(), StepCostModel()
    for i, (seqs, tokens) in enumerate(((1, 512), (64, 64), (8, 200), (17, 17), (30, 300)) * 4):
        seconds = 0.010 + 0.002 * seqs + 0.001 * tokens
        quiet.observe(seqs, tokens, seconds)
        noisy.observe(seqs, tokens, seconds + (0.020 if i % 2 else -0.020))  # +-20 ms
    assert quiet.spread_s == pytest.approx(0, abs=1e-9)
    assert noisy.spread_s == pytest.approx(0.020, abs=0.002)
    # 20 ms less room: about 6-7 fewer decodes (3 ms each) and 20 fewer prompt tokens
    assert quiet.decodes_within(0.150) - noisy.decodes_within(0.150) in (6, 7, 8)
    assert quiet.prompt_tokens_within(0.150, 20) - noisy.prompt_tokens_within(0.150, 20) in (
        19, 20, 21)


def test_latency_budget_fills_the_target_and_keeps_prompts_moving():
    model = StepCostModel()
    assert latency_budget(model, 0.150, 10) == StepBudget()  # nothing learnt: no limits
    for seqs, tokens in ((1, 512), (64, 64), (8, 200), (17, 17), (30, 300)):
        model.observe(seqs, tokens, 0.010 + 0.002 * seqs + 0.001 * tokens)
    assert latency_budget(model, 0.150, 20) in (StepBudget(77, 46), StepBudget(78, 46),
                                                 StepBudget(77, 47), StepBudget(78, 47))
    # 60 decodes alone overshoot the target: prompts get a tenth of it (15 ms: 15 tokens)
    starved = latency_budget(model, 0.150, 60)
    assert starved.prompt_tokens == int(PROMPT_PROGRESS_SHARE * 0.150 / model.per_row_s)
    assert starved.prompt_tokens in (14, 15)


def test_padded_rows_are_what_a_step_costs_and_budgets_fill_them():
    """A model that pads token rows to multiples of 8 pays for the padding: the fit counts
    rows, and the answers are whole buckets (9 tokens cost what 16 do, so 16 fit, not 9)."""
    def rows_of(n):
        return -(-n // 8) * 8

    def cost(seqs, tokens):
        return 0.010 + 0.002 * seqs + 0.001 * rows_of(tokens)

    model = StepCostModel(rows_of=rows_of)
    for seqs, tokens in ((1, 1), (1, 9), (4, 4), (3, 17), (12, 12), (20, 20), (2, 200)):
        model.observe(seqs, tokens, cost(seqs, tokens))
    assert model.per_row_s == pytest.approx(0.001) and model.per_sequence_s == pytest.approx(0.002)
    # 50.5 ms: 3 decodes and one prompt (18 ms) leave 32.5 ms: 32 rows, 29 of them prompt
    assert model.prompt_tokens_within(0.0505, 3) == 29
    assert model.prompt_tokens_within(0.0475, 3) == 21  # 29 rows' time buys 24 rows, not 29
    assert model.decodes_within(0.0505) == 12  # 16 rows: 50 ms; 13 decodes would take 52
    # 40 decodes alone overshoot: the progress floor (5 tokens) fills its 48-row bucket
    assert latency_budget(model, 0.0505, 40).prompt_tokens == 8


def test_noise_with_a_falling_slope_keeps_the_last_good_fit():
    model = StepCostModel(window=4)
    model.observe(1, 10, 0.02)
    model.observe(1, 100, 0.11)
    good = model.per_row_s
    model.observe(1, 400, 0.01)  # a step that took less than a much smaller one
    model.observe(1, 800, 0.005)
    assert model.per_row_s == good


def _cost(seqs, tokens):
    return 0.010 + 0.002 * seqs + 0.001 * tokens


_SHAPES = ((1, 1), (16, 16), (1, 256), (4, 1024), (23, 23), (30, 30), (8, 200), (40, 40))


def test_a_disturbed_step_is_left_out_of_the_fit_and_the_spread():
    """One step slowed by another process (here 4x, at the largest row count, where a plain
    least-squares fit leans on it most) leaves the fit and the budgets as they were."""
    clean, disturbed = StepCostModel(), StepCostModel()
    for seqs, tokens in _SHAPES:
        clean.observe(seqs, tokens, _cost(seqs, tokens))
        disturbed.observe(seqs, tokens, _cost(seqs, tokens))
    disturbed.observe(23, 1627, 4 * _cost(23, 1627))
    for seqs, tokens in ((23, 23), (20, 20), (25, 59)):
        clean.observe(seqs, tokens, _cost(seqs, tokens))
        disturbed.observe(seqs, tokens, _cost(seqs, tokens))
    assert disturbed.per_row_s == pytest.approx(0.001) and disturbed.fixed_s == pytest.approx(0.010)
    assert disturbed.spread_s == pytest.approx(0, abs=1e-9)
    assert latency_budget(disturbed, 0.150, 23) == latency_budget(clean, 0.150, 23)
    steps = [*_SHAPES, (23, 1627), (23, 23), (20, 20), (25, 59)]
    times = [_cost(*step) * (4 if step[1] == 1627 else 1) for step in steps]
    plain = np.linalg.lstsq(np.array([(1, seqs, tokens) for seqs, tokens in steps], float),
                            np.array(times), rcond=None)[0]
    assert plain[2] > 3 * 0.001  # what a plain least-squares fit makes of the same steps


def test_a_short_step_the_fit_misses_by_milliseconds_does_not_bring_a_disturbed_one_back():
    """A server's calibration and its first burst steps, as timed (seconds): the fit misses the
    11 ms one-decode calibration step by a few milliseconds on its own; judged by ratio alone
    that step looked disturbed too, two disturbed steps in seven looked like a new pace, and
    the 154 ms step of one 38-token prompt (the HTTP intake beside it) came back into the fit:
    fixed cost 49 ms, spread 50 ms, 452 prompt tokens budgeted where ~800 fit."""
    model = StepCostModel()
    calibration = [(1, 1, 0.0114), (16, 16, 0.0137), (1, 256, 0.0443), (4, 1024, 0.1434)]
    for step in [*calibration, (1, 38, 0.1544), (18, 1120, 0.1677), (32, 997, 0.1696)]:
        model.observe(*step)
    quiet = StepCostModel()  # the same steps without the disturbed one
    for step in [*calibration, (18, 1120, 0.1677), (32, 997, 0.1696)]:
        quiet.observe(*step)
    assert model.fixed_s == pytest.approx(quiet.fixed_s) and model.fixed_s < 0.010
    assert model.per_row_s == pytest.approx(quiet.per_row_s)
    assert model.spread_s == pytest.approx(quiet.spread_s) and model.spread_s < 0.010
    assert latency_budget(model, 0.150, 32).prompt_tokens > 750


def test_the_fit_follows_a_new_pace_once_it_is_more_than_a_tenth_of_the_window():
    """Steps twice as slow from some point on are a slower machine, not a disturbance."""
    model = StepCostModel(window=64)
    for seqs, tokens in _SHAPES * 4:
        model.observe(seqs, tokens, _cost(seqs, tokens))
    assert model.per_row_s == pytest.approx(0.001)
    for seqs, tokens in _SHAPES * 2:
        model.observe(seqs, tokens, 2.5 * _cost(seqs, tokens))
    assert model.per_row_s > 1.3 * 0.001 and model.decodes_within(0.150) < 40  # was 46
