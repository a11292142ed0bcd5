"""Scheduler: token budget, FCFS admission, chunked prefill, preemption by recompute, progress."""
from paged_core.core.kv_cache_manager import KVCacheManager
from paged_core.core.scheduler import MIN_RUNNING_UNDER_LATENCY_TARGET, Scheduler, StepBudget
from paged_core.core.sequence import Sequence, SequenceStatus


def make_seq(seq_id, n):
    return Sequence(seq_id, None, list(range(100 * seq_id, 100 * seq_id + n)), n, 0)


def run_step(sched: Scheduler, new_token=1, budget: StepBudget | None = None):
    """Apply a schedule the way the engine does: advance, then append one token to completed ones."""
    out = sched.schedule(budget)
    for item in out.scheduled:
        seq = item.seq
        seq.num_computed_tokens += item.num_new_tokens
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(new_token)
    return out


def test_budget_chunks_prefill_and_packs_decodes():
    sched = Scheduler(KVCacheManager(100, 4, False), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = make_seq(1, 3), make_seq(2, 20)
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 3), (b, 7)]
    out = run_step(sched)  # a decodes (1 token), b continues its prefill chunk (9)
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 9)]
    assert b.num_computed_tokens == 16 and b.num_tokens == 20


def test_max_num_seqs_limits_running():
    sched = Scheduler(KVCacheManager(100, 4, False), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [make_seq(i, 2) for i in range(1, 5)]
    for s in seqs:
        sched.add(s)
    out = run_step(sched)
    assert [s.seq for s in out.scheduled] == seqs[:2]
    sched.finish(seqs[0])
    out = run_step(sched)
    assert [s.seq for s in out.scheduled] == [seqs[1], seqs[2]]  # a finished one leaves, a new one joins


def test_preempts_newest_and_everyone_finishes():
    kv = KVCacheManager(6, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    seqs = [make_seq(i, 6) for i in range(1, 4)]  # 2 blocks each; 6 blocks in all
    for s in seqs:
        sched.add(s)
    finished = []
    for _ in range(200):
        if not sched.has_unfinished:
            break
        run_step(sched)
        for s in list(sched.running):
            if s.num_output_tokens >= 10:  # each wants 16 tokens = 4 blocks
                sched.finish(s)
                finished.append(s)
    assert sorted(s.seq_id for s in finished) == [1, 2, 3]
    assert sched.num_preemptions > 0
    assert kv.stats()["kv_blocks_used"] == 0
    assert finished[0].seq_id == 1  # the oldest is never the one preempted first


def test_preempted_sequence_recomputes_from_zero():
    kv = KVCacheManager(3, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    a, b = make_seq(1, 4), make_seq(2, 4)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both prefilled: 2 blocks used, each now has 5 tokens
    out = run_step(sched)  # both need a second block; only one is left -> b preempted
    assert out.preempted == [b]
    assert b.status == SequenceStatus.WAITING and b.num_computed_tokens == 0
    assert sched.waiting.peek() is b


def _chunks(out):
    return [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled]


def test_prefill_limits_bound_steps_that_carry_decodes():
    sched = Scheduler(KVCacheManager(200, 4, False), max_num_seqs=8, max_num_batched_tokens=100,
                      long_prefill_token_threshold=8, max_num_partial_prefills=2)
    a = make_seq(1, 30)
    sched.add(a)
    assert _chunks(run_step(sched)) == [(1, 30)]  # nothing decodes yet: the whole budget
    for seq_id in (2, 3, 4):
        sched.add(make_seq(seq_id, 30))
    # a decodes; at most 2 prefills, 8 tokens each, join it; the third prompt waits
    assert _chunks(run_step(sched)) == [(1, 1), (2, 8), (3, 8)]
    assert _chunks(run_step(sched)) == [(1, 1), (2, 8), (3, 8)]
    assert [s.seq_id for s in sched.waiting] == [4]


def test_prefill_limits_never_hold_back_decodes():
    sched = Scheduler(KVCacheManager(200, 4, False), max_num_seqs=8, max_num_batched_tokens=100,
                      long_prefill_token_threshold=4, max_num_partial_prefills=1)
    seqs = [make_seq(i, 2) for i in range(1, 4)]
    for s in seqs:
        sched.add(s)
    run_step(sched)  # three short prompts, no decode in flight: all admitted at once
    sched.add(make_seq(9, 40))
    assert _chunks(run_step(sched)) == [(1, 1), (2, 1), (3, 1), (9, 4)]


def test_prompt_token_budget_bounds_prefill_beside_decodes():
    sched = Scheduler(KVCacheManager(200, 4, False), max_num_seqs=8, max_num_batched_tokens=100)
    sched.add(make_seq(1, 3))
    sched.add(make_seq(2, 3))
    run_step(sched, new_token=7)
    sched.add(make_seq(3, 50))
    assert _chunks(sched.schedule(StepBudget(prompt_tokens=10))) == [(1, 1), (2, 1), (3, 10)]
    sched2 = Scheduler(KVCacheManager(200, 4, False), max_num_seqs=8, max_num_batched_tokens=100)
    sched2.add(make_seq(1, 3))
    run_step(sched2)
    sched2.add(make_seq(3, 50))
    # decodes alone exceed the target: prompts still advance (one token at the very least)
    assert _chunks(sched2.schedule(StepBudget(prompt_tokens=0))) == [(1, 1), (3, 1)]


def test_running_cap_holds_a_burst_in_the_queue_but_never_below_the_floor():
    floor = MIN_RUNNING_UNDER_LATENCY_TARGET
    sched = Scheduler(KVCacheManager(1000, 4, False), max_num_seqs=64, max_num_batched_tokens=1000)
    for i in range(1, 41):
        sched.add(make_seq(i, 3))
    out = run_step(sched, budget=StepBudget(max_running=floor + 4))
    assert len(out.scheduled) == floor + 4 and len(sched.waiting) == 40 - floor - 4
    out = run_step(sched, budget=StepBudget(max_running=floor + 4))  # the rest keep waiting
    assert [item.num_new_tokens for item in out.scheduled] == [1] * (floor + 4)
    out = run_step(sched, budget=StepBudget(max_running=floor + 8))  # the step got cheaper
    assert [item.num_new_tokens for item in out.scheduled] == [1] * (floor + 4) + [3] * 4
    tight = Scheduler(KVCacheManager(1000, 4, False), max_num_seqs=64, max_num_batched_tokens=1000)
    for i in range(1, 41):
        tight.add(make_seq(i, 3))
    assert len(tight.schedule(StepBudget(max_running=2)).scheduled) == floor
    small = Scheduler(KVCacheManager(1000, 4, False), max_num_seqs=4, max_num_batched_tokens=1000)
    for i in range(1, 9):
        small.add(make_seq(i, 3))
    assert len(small.schedule(StepBudget(max_running=100)).scheduled) == 4  # max_num_seqs rules


def test_running_cap_holds_long_prompts_even_when_nothing_decodes():
    """A step with no decode in flight computes whole prompts, but only as many as whose
    decodes fit the target: the floor is for short prompts, and one always runs."""
    sched = Scheduler(KVCacheManager(1000, 4, False), max_num_seqs=64, max_num_batched_tokens=1000)
    for i in range(1, 21):
        sched.add(make_seq(i, 30))
    out = run_step(sched, budget=StepBudget(max_running=5))
    assert _chunks(out) == [(i, 30) for i in range(1, 6)] and len(sched.waiting) == 15
    sched.add(make_seq(40, 3))  # behind the long ones (FCFS): it waits its turn too
    assert [n for _, n in _chunks(sched.schedule(StepBudget(max_running=5)))] == [1] * 5
    starved = Scheduler(KVCacheManager(1000, 4, False), max_num_seqs=64, max_num_batched_tokens=1000)
    for i in range(1, 4):
        starved.add(make_seq(i, 30))
    assert _chunks(starved.schedule(StepBudget(max_running=0))) == [(1, 30)]


def test_a_long_prompt_with_a_cached_prefix_is_not_short():
    """The floor is for short prompts: a long one whose prefix is cached (its rest fits in a
    block) starts under the latency cap like any long prompt; a short one still starts."""
    sched = Scheduler(KVCacheManager(200, 4, True), max_num_seqs=32, max_num_batched_tokens=100)
    first = make_seq(1, 30)
    sched.add(first)
    run_step(sched)
    sched.finish(first)  # its full blocks stay in the prefix cache
    sched.add(make_seq(2, 3))
    run_step(sched)  # one sequence decodes from now on
    sched.add(Sequence(3, None, list(range(100, 130)), 30, 0))  # 28 of 30 tokens cached
    sched.add(make_seq(4, 3))
    out = sched.schedule(StepBudget(prompt_tokens=100, max_running=1))
    assert _chunks(out) == [(2, 1)] and len(sched.waiting) == 2  # FCFS: the short one waits
    # once the cap allows it, it computes only its uncached rest; the short one follows
    assert _chunks(sched.schedule(StepBudget(prompt_tokens=100, max_running=2))) == [
        (2, 1), (3, 2), (4, 3)]


def test_short_prompts_start_whole_while_few_run_long_ones_wait_for_the_budget():
    sched = Scheduler(KVCacheManager(200, 4, False), max_num_seqs=32, max_num_batched_tokens=100)
    sched.add(make_seq(1, 3))
    run_step(sched)  # one sequence decodes from now on
    for i, n in ((2, 4), (3, 30), (4, 3), (5, 2)):
        sched.add(make_seq(i, n))
    # two prompt tokens allowed: the long prompt gets them; short ones (<= a block) start whole
    assert _chunks(sched.schedule(StepBudget(prompt_tokens=2))) == [
        (1, 1), (2, 4), (3, 2), (4, 3), (5, 2)]
    busy = Scheduler(KVCacheManager(400, 4, False), max_num_seqs=32, max_num_batched_tokens=100)
    for i in range(1, MIN_RUNNING_UNDER_LATENCY_TARGET + 1):
        busy.add(make_seq(i, 2))
    run_step(busy)
    busy.add(make_seq(40, 3))  # as many running as the floor: the short prompt takes its turn
    out = busy.schedule(StepBudget(prompt_tokens=1))
    assert _chunks(out)[-1] == (40, 1)
