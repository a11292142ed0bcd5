"""The step pacer: no target, no budget and nothing learnt; a target, a budget once learnt."""
import pytest

from paged_core.core.step_pacer import StepPacer


def test_without_a_target_there_is_no_budget_and_nothing_is_learnt():
    pacer = StepPacer(None, rows_of=int)
    pacer.observe(1, 1, 0.001)
    pacer.observe(1, 100, 0.01)
    assert pacer.budget(num_decodes=4, team=None) is None
    assert pacer.cost.decodes_within(1.0) is None  # the cost model saw no step


def test_with_a_target_the_budget_follows_the_learnt_cost():
    pacer = StepPacer(10, rows_of=int)
    # nothing learnt yet: no limit
    assert pacer.budget(num_decodes=0, team=None).prompt_tokens is None
    pacer.observe(1, 1, 0.0005)
    pacer.observe(1, 101, 0.0105)  # 0.1 ms a token
    budget = pacer.budget(num_decodes=1, team=None)
    assert budget.prompt_tokens is not None and 50 <= budget.prompt_tokens <= 100


def _cost(seqs, tokens, threads):
    return (0.010 + 0.002 * seqs + 0.001 * tokens) * 2 / threads


CALIBRATION = [(1, 1), (16, 16), (1, 256), (4, 1024)]


def test_each_openmp_team_size_learns_its_own_cost():
    """Steps on a team of 1 never move the fit of the team of 2 the engine calibrated, and a
    team met for the first time starts from the calibration scaled by the teams' ratio."""
    pacer = StepPacer(150, rows_of=int)
    pacer.calibrate([(seqs, tokens, _cost(seqs, tokens, 2)) for seqs, tokens in CALIBRATION],
                    team=2)
    two = pacer.budget(num_decodes=10, team=2)
    assert pacer.cost.per_row_s == pytest.approx(0.001)
    pacer.observe(23, 23, _cost(23, 23, 1), team=1)  # the team gave a thread up
    assert pacer.team == 1 and pacer.cost.per_row_s == pytest.approx(0.002)
    for seqs, tokens in ((30, 30), (8, 200), (20, 20), (25, 59)) * 3:
        pacer.observe(seqs, tokens, _cost(seqs, tokens, 1), team=1)
    one = pacer.budget(num_decodes=10, team=1)
    assert pacer.cost.per_row_s == pytest.approx(0.002) and one.prompt_tokens < two.prompt_tokens / 1.8
    pacer.observe(10, 10, _cost(10, 10, 2), team=2)  # the thread is back
    assert pacer.cost.per_row_s == pytest.approx(0.001)
    assert pacer.budget(num_decodes=10, team=2) == two


def test_a_fixed_team_is_one_model():
    pacer = StepPacer(150, rows_of=int)
    pacer.calibrate([(seqs, tokens, _cost(seqs, tokens, 2)) for seqs, tokens in CALIBRATION],
                    team=None)
    pacer.observe(23, 23, _cost(23, 23, 2))
    assert pacer.team is None and pacer.cost.per_row_s == pytest.approx(0.001)


def test_a_step_is_budgeted_with_the_team_that_will_run_it():
    """The team gives a thread up before the next step: that step's budget is the smaller
    team's, though the last step ran on two threads."""
    pacer = StepPacer(150, rows_of=int)
    pacer.calibrate([(seqs, tokens, _cost(seqs, tokens, 2)) for seqs, tokens in CALIBRATION],
                    team=2)
    pacer.observe(10, 10, _cost(10, 10, 2), team=2)
    two, one = pacer.budget(num_decodes=10, team=2), pacer.budget(num_decodes=10, team=1)
    assert pacer.team == 2 and one.prompt_tokens < two.prompt_tokens / 1.8
