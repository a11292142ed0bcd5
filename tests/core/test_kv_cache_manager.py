"""Block pool and KV-cache manager: invariants under random operations, prefix caching, CoW."""
from hypothesis import given, settings
from hypothesis import strategies as st

from paged_core.core.block_hash import hash_block
from paged_core.core.kv_cache_manager import KVCacheManager
from paged_core.core.block_pool import BlockPool
from paged_core.core.sequence import Sequence

BLOCK = 4


def make_seq(seq_id, tokens, cache_salt=None):
    return Sequence(seq_id, request=None, token_ids=list(tokens), num_prompt_tokens=len(tokens),
                    sample_index=0, cache_salt=cache_salt)


def check_invariants(kv: KVCacheManager):
    pool = kv.pool
    used = sum(1 for b in pool.blocks if b.ref_cnt > 0)
    cached = sum(1 for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is not None)
    free = sum(1 for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is None)
    assert free + cached + used == pool.num_blocks
    assert all(b.ref_cnt >= 0 for b in pool.blocks)
    stats = kv.stats()
    assert (stats["kv_blocks_used"], stats["kv_blocks_cached"], stats["kv_blocks_free"]) == (used, cached, free)
    assert pool.free_block_queue.num_blocks == free + cached
    # Reference counts equal the number of block tables holding each block.
    holders = {}
    for table in kv.block_tables.values():
        for b in table:
            holders[b.block_id] = holders.get(b.block_id, 0) + 1
    assert all(b.ref_cnt == holders.get(b.block_id, 0) for b in pool.blocks)
    for h, b in pool.cached_blocks.items():
        assert b.block_hash == h
    # The block ids a step reads are kept alongside each table, never stale.
    assert kv._block_ids == {seq_id: [b.block_id for b in table]
                             for seq_id, table in kv.block_tables.items()}


operations = st.lists(st.tuples(st.sampled_from(["new", "grow", "fork", "rollback", "free"]),
                                st.integers(0, 10**6), st.integers(1, 9)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=operations, prefix_caching=st.booleans(), num_blocks=st.integers(4, 24))
def test_random_operations_keep_invariants(ops, prefix_caching, num_blocks):
    kv = KVCacheManager(num_blocks, BLOCK, prefix_caching)
    live: list[Sequence] = []
    next_id = 0
    for op, pick, amount in ops:
        if op == "new":
            # Prompts drawn from a small alphabet so prefixes repeat and hit the cache.
            seq = make_seq(next_id, [(pick >> i) % 3 for i in range(amount + 2)])
            next_id += 1
            cached = kv.find_cached_prefix(seq)
            if kv.allocate_slots(seq, seq.num_tokens - len(cached) * BLOCK, cached):
                seq.num_computed_tokens = seq.num_tokens
                live.append(seq)
        elif op == "grow" and live:
            seq = live[pick % len(live)]
            seq.token_ids.extend([pick % 3] * amount)
            if kv.allocate_slots(seq, amount):
                seq.num_computed_tokens = seq.num_tokens
            else:
                del seq.token_ids[-amount:]
        elif op == "fork" and live:
            parent = live[pick % len(live)]
            child = make_seq(next_id, parent.token_ids)
            child.num_computed_tokens = parent.num_computed_tokens
            next_id += 1
            kv.fork(parent, child)
            live.append(child)
        elif op == "rollback" and live:  # draft slots taken, then the drafts rejected
            seq = live[pick % len(live)]
            if kv.allocate_slots(seq, amount):
                kv.free_blocks_past_computed(seq)
        elif op == "free" and live:
            kv.free(live.pop(pick % len(live)))
        kv.take_pending_copies()
        check_invariants(kv)
    for seq in live:
        kv.free(seq)
    check_invariants(kv)
    assert kv.stats()["kv_blocks_used"] == 0


def test_blocks_allocated_on_demand_at_block_boundaries():
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=False)
    seq = make_seq(0, range(5))
    assert kv.allocate_slots(seq, 5)
    assert len(kv.block_tables[0]) == 2
    seq.num_computed_tokens = 5
    for expected_blocks, _ in zip([2, 2, 2, 3], range(4)):
        seq.token_ids.append(1)
        assert kv.allocate_slots(seq, 1)
        seq.num_computed_tokens += 1
        assert len(kv.block_tables[0]) == expected_blocks


def test_allocation_fails_cleanly_when_full():
    kv = KVCacheManager(2, BLOCK, enable_prefix_caching=False)
    seq = make_seq(0, range(12))
    assert not kv.allocate_slots(seq, 12)
    assert kv.stats()["kv_blocks_used"] == 0 and 0 not in kv.block_tables


def test_prefix_hit_reuses_blocks_and_leaves_last_token_to_compute():
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    first = make_seq(0, range(8))  # exactly two full blocks
    assert kv.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    first_blocks = list(kv.block_tables[0])
    kv.free(first)
    assert kv.stats()["kv_blocks_cached"] == 2

    same = make_seq(1, range(8))
    hits = kv.find_cached_prefix(same)
    assert len(hits) == 1  # the whole prompt is cached, but its last token is computed again
    longer = make_seq(2, list(range(8)) + [99])
    hits = kv.find_cached_prefix(longer)
    assert hits == first_blocks
    assert kv.allocate_slots(longer, 1, hits)
    assert kv.block_tables[2][:2] == hits and all(b.ref_cnt == 1 for b in hits)


def test_a_cache_salt_shares_blocks_only_with_the_same_salt():
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    cached = {}
    for seq_id, salt in enumerate((None, "tenant-a")):
        seq = make_seq(seq_id, range(9), salt)
        assert kv.find_cached_prefix(seq) == []  # nothing under this salt is cached yet
        assert kv.allocate_slots(seq, 9)
        seq.num_computed_tokens = 9
        cached[salt] = list(kv.block_tables[seq_id][:2])
        kv.free(seq)
    assert kv.stats()["kv_blocks_cached"] == 4  # each salt's two full blocks, apart
    for seq_id, salt in ((2, None), (3, "tenant-a")):
        assert kv.find_cached_prefix(make_seq(seq_id, range(9), salt)) == cached[salt]
    assert kv.find_cached_prefix(make_seq(4, range(9), "tenant-b")) == []


def test_long_rotated_keys_share_blocks_only_with_long_rotated_ones():
    """LongRoPE: the same tokens' keys rotated with the long factors are other blocks; a fork
    inherits its parent's rotation."""
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=True)
    short = make_seq(0, range(9))
    assert kv.allocate_slots(short, 9)
    short.num_computed_tokens = 9
    long = make_seq(1, range(9))
    long.rotated_long = True
    assert kv.find_cached_prefix(long) == []
    assert kv.allocate_slots(long, 9)
    child = make_seq(2, range(9))
    kv.fork(long, child)
    assert child.rotated_long and child.block_hashes == long.block_hashes
    assert long.block_hashes[0] != short.block_hashes[0]


def test_eviction_is_lru_tail_first():
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    seq = make_seq(0, range(12))
    assert kv.allocate_slots(seq, 12)
    first, second, third = kv.block_tables[0]
    seq.num_computed_tokens = 12  # the step ran
    kv.free(seq)
    (taken,) = kv.pool.get_new_blocks(2)[1:]  # the never-used block, then the tail block
    assert taken is third and third.block_hash is None
    assert first.block_hash is not None and second.block_hash is not None


def test_blocks_freed_before_their_step_ran_lose_their_hash():
    kv = KVCacheManager(4, BLOCK, enable_prefix_caching=True)
    seq = make_seq(0, range(12))
    assert kv.allocate_slots(seq, 12)  # all 3 blocks hashed when scheduled
    first, second, third = kv.block_tables[0]
    seq.num_computed_tokens = 4  # only the first block's K/V was computed
    kv.free(seq)
    assert first.block_hash is not None and second.block_hash is None and third.block_hash is None
    assert len(kv.find_cached_prefix(make_seq(1, range(12)))) == 1


def test_fork_shares_blocks_and_copies_partial_block_on_write():
    kv = KVCacheManager(10, BLOCK, enable_prefix_caching=False)
    parent = make_seq(0, range(6))
    assert kv.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    child = make_seq(1, range(6))
    child.num_computed_tokens = 6
    kv.fork(parent, child)
    assert kv.block_ids(parent) == kv.block_ids(child)
    assert kv.stats()["kv_blocks_used"] == 2
    child.token_ids.append(7)
    assert kv.allocate_slots(child, 1)  # writes into the shared partial block -> private copy
    copies = kv.take_pending_copies()
    assert copies == [(kv.block_ids(parent)[1], kv.block_ids(child)[1])]
    assert kv.block_ids(parent)[0] == kv.block_ids(child)[0]
    parent.token_ids.append(8)
    assert kv.allocate_slots(parent, 1)  # now the only holder: writes in place
    assert kv.take_pending_copies() == []
    assert kv.stats()["kv_blocks_used"] == 3


def test_block_hash_is_chained_and_stable():
    a = hash_block(None, [1, 2, 3, 4])
    assert a == hash_block(None, [1, 2, 3, 4])
    assert hash_block(a, [5, 6, 7, 8]) != hash_block(None, [5, 6, 7, 8])
    # Stable across processes: a fixed digest, not Python's salted hash().
    assert a.hex() == hash_block(None, [1, 2, 3, 4]).hex() and len(a) == 16


def test_double_free_is_an_error():
    import pytest
    pool = BlockPool(2, enable_prefix_caching=False)
    (block,) = pool.get_new_blocks(1)
    pool.free_blocks([block])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free_blocks([block])
