"""Scheduler: token budget, FCFS admission, chunked prefill, preemption by recompute, progress."""
from paged_core.block_manager import KVCacheManager
from paged_core.scheduler import Scheduler
from paged_core.sequence import Sequence, SequenceStatus


def make_seq(seq_id, n):
    return Sequence(seq_id, None, list(range(100 * seq_id, 100 * seq_id + n)), n, 0)


def run_step(sched: Scheduler, new_token=1):
    """Apply a schedule the way the engine does: advance, then append one token to completed ones."""
    out = sched.schedule()
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
