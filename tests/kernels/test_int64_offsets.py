"""Addresses past 2**31 elements: every kernel must index the cache in int64.

The cache is one ``torch.empty`` allocation of just over 2**31 float16 elements
(4 GiB of *virtual* memory) with K and V blocks interleaved (block stride = two
blocks), and the test touches only a handful of blocks at its top, so only
those pages become resident: the run needs a few MiB of RAM, not 4 GiB. (The
interpreter's argument copy-back is a no-op here because it copies a storage
onto itself.) With int32 arithmetic, ``block * block_stride`` wraps for these
blocks and the kernels read or write the wrong address, so this test fails
(or crashes) on such a regression.
"""
import resource

import pytest
import torch

from paged_core.kernels import copy_blocks, paged_attention, reference, write_kv_cache

BLOCK_SIZE, KV_HEADS, HEAD_DIM = 16, 1, 16
BLOCK_NUMEL = BLOCK_SIZE * KV_HEADS * HEAD_DIM
NUM_BLOCKS = 2**31 // (2 * BLOCK_NUMEL) + 2
TOP = NUM_BLOCKS - 1


@pytest.fixture
def huge_cache(device):
    try:
        storage = torch.empty(NUM_BLOCKS * 2 * BLOCK_NUMEL, dtype=torch.float16, device=device)
    except (RuntimeError, MemoryError) as exc:  # no 4 GiB of address space / GPU memory
        pytest.skip(f"cannot reserve a 4 GiB cache: {exc}")
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    strides = (2 * BLOCK_NUMEL, KV_HEADS * HEAD_DIM, HEAD_DIM, 1)
    k_cache = storage.as_strided(shape, strides, 0)
    v_cache = storage.as_strided(shape, strides, BLOCK_NUMEL)
    assert TOP * k_cache.stride(0) >= 2**31  # the top blocks really are past int32 range
    return k_cache, v_cache


def test_write_attend_and_copy_at_top_of_huge_cache(device, huge_cache):
    k_cache, v_cache = huge_cache
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gen = torch.Generator().manual_seed(0)
    # Sequence 0: 40 tokens in blocks [TOP, 5, TOP - 2]; sequence 1: 20 in [TOP - 1, TOP - 4].
    tables = torch.tensor([[TOP, 5, TOP - 2], [TOP - 1, TOP - 4, 0]], dtype=torch.int32)
    seq_lens = [40, 20]
    slots = torch.cat([tables[i, torch.arange(n) // BLOCK_SIZE].long() * BLOCK_SIZE
                       + torch.arange(n) % BLOCK_SIZE for i, n in enumerate(seq_lens)])
    key = torch.randn(60, KV_HEADS, HEAD_DIM, generator=gen).half()
    value = torch.randn(60, KV_HEADS, HEAD_DIM, generator=gen).half()
    write_kv_cache(key.to(device), value.to(device), k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache[TOP].cpu(), key[:16]) and torch.equal(v_cache[TOP].cpu(), value[:16])
    assert torch.equal(k_cache[TOP - 4, :4].cpu(), key[56:])

    # Attention: the last 9 tokens of sequence 0 (a prefill chunk) and a decode of sequence 1,
    # once directly and once through the split-KV path.
    q = torch.randn(10, 4, HEAD_DIM, generator=gen).half().to(device)
    tables, seq_lens_t = tables.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device)
    query_start_loc = torch.tensor([0, 9, 10], dtype=torch.int32, device=device)
    args = (k_cache, v_cache, tables, seq_lens_t, query_start_loc, 0.25)
    expected = reference.paged_attention(q, *args).cpu()  # gathers only the used blocks
    for num_splits in (1, 2):
        out = paged_attention(q, *args, num_splits=num_splits)
        torch.testing.assert_close(out.cpu(), expected, atol=2e-3, rtol=4e-3)

    copy_blocks(k_cache, v_cache, torch.tensor([TOP, 5], device=device),
                torch.tensor([TOP - 3, TOP - 5], device=device))
    assert torch.equal(k_cache[TOP - 3].cpu(), key[:16])
    assert torch.equal(v_cache[TOP - 3].cpu(), value[:16])
    assert torch.equal(v_cache[TOP - 5].cpu(), value[16:32])

    if device.type == "cpu":  # ru_maxrss is in KiB on Linux: the 4 GiB stayed virtual
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        assert grown_mib < 512, f"resident memory grew by {grown_mib:.0f} MiB"
