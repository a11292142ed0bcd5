"""``WaitingQueue`` and the scheduler's priority policy, on hand-made sequences (no model)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paged_core.core.kv_cache_manager import KVCacheManager
from paged_core.core.scheduler import Scheduler
from paged_core.core.sequence import Sequence
from paged_core.core.waiting_queue import WaitingQueue

from .test_scheduler import run_step

_ids = iter(range(1, 10**6))


def seq(num_tokens=4, priority=0, tenant=None) -> Sequence:
    sid = next(_ids)
    request = SimpleNamespace(priority=priority, tenant=tenant)
    return Sequence(sid, request, list(range(num_tokens)), num_tokens, 0)


def drain(queue: WaitingQueue) -> list[Sequence]:
    order = list(queue)
    popped = [queue.popleft() for _ in range(len(queue))]
    assert popped == order and not queue  # iteration predicts popleft
    return popped


def test_fcfs_ignores_priority_and_tenants():
    queue = WaitingQueue("fcfs", fair=False)
    seqs = [seq(priority=p, tenant=t) for p, t in [(5, "a"), (0, "b"), (-3, "a")]]
    for s in seqs:
        queue.append(s)
    assert queue.peek() is seqs[0] and len(queue) == 3
    assert drain(queue) == seqs


def test_priority_lower_value_first_fcfs_within_a_level():
    queue = WaitingQueue("priority")
    low1, high1, low2, high2, mid = (seq(priority=p) for p in (10, -1, 10, -1, 0))
    for s in (low1, high1, low2, high2, mid):
        queue.append(s)
    assert drain(queue) == [high1, high2, mid, low1, low2]


def test_fairness_lets_tenants_take_turns_so_a_burst_cannot_starve_others():
    queue = WaitingQueue("fcfs", fair=True)
    burst = [seq(tenant="bulk") for _ in range(5)]
    for s in burst:
        queue.append(s)
    alice, bob = seq(tenant="alice"), seq(tenant="bob")
    queue.append(alice)
    queue.append(bob)
    # bulk's first was next anyway; then everyone gets a turn before bulk's second
    assert drain(queue) == [burst[0], alice, bob, burst[1], burst[2], burst[3], burst[4]]


def test_fairness_within_priority_levels():
    queue = WaitingQueue("priority", fair=True)
    a_low, a_high1, a_high2, b_high = (seq(priority=p, tenant=t) for p, t in
                                       [(1, "a"), (0, "a"), (0, "a"), (0, "b")])
    for s in (a_low, a_high1, a_high2, b_high):
        queue.append(s)
    assert drain(queue) == [a_high1, b_high, a_high2, a_low]


def test_preempted_goes_first_and_remove_finds_anything():
    queue = WaitingQueue("priority", fair=True)
    a1, a2, b1 = seq(tenant="a"), seq(tenant="a"), seq(tenant="b")
    for s in (a1, a2, b1):
        queue.append(s)
    preempted = seq(tenant="b")
    queue.appendleft(preempted)
    assert queue.peek() is preempted
    queue.remove(a2)
    with pytest.raises(ValueError):
        queue.remove(a2)
    assert drain(queue) == [preempted, a1, b1]
    with pytest.raises(IndexError):
        queue.peek()
    with pytest.raises(ValueError, match="scheduling_policy"):
        WaitingQueue("lifo")


def test_priority_admission_order_and_preemption_picks_lowest_priority_newest():
    kv = KVCacheManager(6, 4, False)  # 6 blocks of 4 tokens
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64, policy="priority")
    low_old, low_new, high = seq(4, priority=5), seq(4, priority=5), seq(4, priority=0)
    for s in (low_old, low_new, high):
        sched.add(s)
    out = run_step(sched)
    assert [i.seq for i in out.scheduled] == [high, low_old, low_new]  # priority order
    # every sequence now needs a second block; then a third: only 6 blocks in all
    for _ in range(4):
        run_step(sched)
    out = run_step(sched)
    assert out.preempted and out.preempted[0] is low_new  # lowest priority, newest first
    assert high in sched.running and low_old in sched.running


def test_preempting_a_sequence_scheduled_earlier_in_the_same_step():
    kv = KVCacheManager(3, 4, False)  # 3 blocks of 4 tokens
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=5, policy="priority")
    low, high = seq(4, priority=9), seq(12, priority=0)
    sched.add(low)
    run_step(sched)  # low: 4 prompt tokens (1 block), then 1 generated
    sched.add(high)
    out = run_step(sched)  # low decodes into its 2nd block; high's first chunk takes the 3rd
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(low, 1), (high, 4)]
    out = run_step(sched)  # low is scheduled first, then high needs a 4th block: low goes
    assert out.preempted == [low] and sched.waiting.peek() is low and sched.running == [high]
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(high, 4)]
    assert kv.stats()["kv_blocks_used"] == 2 and low.num_computed_tokens == 0


def test_a_preempted_sequence_leaves_no_uncomputed_block_in_the_prefix_cache():
    """A block a sequence fills in this step is hashed when scheduled; if the sequence is then
    preempted before the step runs, that block's keys were never computed: no later prompt may
    find it in the prefix cache (it would read garbage K/V)."""
    kv = KVCacheManager(7, 4, True)  # 7 blocks of 4 tokens, prefix caching on
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=16,
                      long_prefill_token_threshold=6, policy="priority")
    decode = seq(1, priority=0)
    sched.add(decode)
    run_step(sched)  # decode: 1 block; from now on a decode is in flight
    low = Sequence(next(_ids), SimpleNamespace(priority=9, tenant=None),
                   list(range(1000, 1030)), 30, 0)  # a long prompt, 6 tokens a step
    sched.add(low)
    run_step(sched)  # low: tokens 0-5 (2 blocks)
    high = seq(4, priority=0)
    sched.add(high)
    run_step(sched)  # low: tokens 6-11 (3 blocks); high: its 4 prompt tokens (1 block)
    out = run_step(sched)  # low's chunk 12-17 takes the last 2 blocks (block 3 now full),
    assert out.preempted == [low]  # then high's next token needs a block: low goes
    assert [(i.seq, i.num_new_tokens) for i in out.scheduled] == [(decode, 1), (high, 1)]
    twin = Sequence(next(_ids), SimpleNamespace(priority=0, tenant=None),
                    list(range(1000, 1017)), 17, 0)
    assert len(kv.find_cached_prefix(twin)) == 3  # blocks 0-2 were computed; block 3 was not


def test_everyone_finishes_under_priority_with_a_tiny_cache():
    kv = KVCacheManager(8, 4, False)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=32, policy="priority",
                      tenant_fairness=True)
    seqs = [seq(5, priority=i % 3, tenant=f"t{i % 2}") for i in range(6)]
    for s in seqs:
        sched.add(s)
    finished = []
    for _ in range(500):
        if not sched.has_unfinished:
            break
        run_step(sched)
        for s in list(sched.running):
            if s.num_output_tokens >= 12:  # 17 tokens = 5 blocks; 8 in the pool
                sched.finish(s)
                finished.append(s)
    assert sorted(s.seq_id for s in finished) == sorted(s.seq_id for s in seqs)
    assert kv.stats()["kv_blocks_used"] == 0
