"""The step pacer: no target, no budget and nothing learnt; a target, a budget once learnt."""
from paged_core.core.step_pacer import StepPacer


def test_without_a_target_there_is_no_budget_and_nothing_is_learnt():
    pacer = StepPacer(None, rows_of=int)
    pacer.observe(1, 1, 0.001)
    pacer.observe(1, 100, 0.01)
    assert pacer.budget(num_decodes=4) is None
    assert pacer.cost.decodes_within(1.0) is None  # the cost model saw no step


def test_with_a_target_the_budget_follows_the_learnt_cost():
    pacer = StepPacer(10, rows_of=int)
    assert pacer.budget(num_decodes=0).prompt_tokens is None  # nothing learnt yet: no limit
    pacer.observe(1, 1, 0.0005)
    pacer.observe(1, 101, 0.0105)  # 0.1 ms a token
    budget = pacer.budget(num_decodes=1)
    assert budget.prompt_tokens is not None and 50 <= budget.prompt_tokens <= 100
