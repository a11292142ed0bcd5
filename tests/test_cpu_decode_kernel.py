"""The fused CPU paged-decode kernel matches a float64 gather + softmax reference."""
import math

import pytest
import torch

from paged_core.attention.cpu_kernels import cpu_decode_kernel_available, paged_decode_attention

pytestmark = pytest.mark.skipif(not cpu_decode_kernel_available(),
                                reason="fused CPU decode kernel could not be built here "
                                       "(see the logged warning for why)")


def _reference(query, k_cache, v_cache, block_tables, seq_lens, scale, window):
    """Per sequence: gather its keys/values by position, softmax in float64."""
    num_kv_heads, _, block_size, head_dim = k_cache.shape
    group = query.shape[1] // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    for i, n in enumerate(seq_lens.tolist()):
        pos = torch.arange(n)
        if window is not None:
            pos = pos[pos > n - 1 - window]
        blocks = block_tables[i].long()[pos // block_size]
        k = k_cache[:, blocks, pos % block_size].double()  # [Hk, L, D]
        v = v_cache[:, blocks, pos % block_size].double()
        q = query[i].double().view(num_kv_heads, group, head_dim)
        probs = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
        out[i] = (probs @ v).reshape(-1, head_dim)
    return out


def _case(seq_lens, num_kv_heads, group, head_dim, block_size, dtype, seed=0):
    """Random cache with shuffled physical blocks; every unused slot holds NaN."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needed) + 3  # a few blocks nobody owns
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(needed) + 2
    block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    used = 0
    for i, (n, nb) in enumerate(zip(seq_lens, needed)):
        phys = perm[used:used + nb]
        used += nb
        block_tables[i, :nb] = phys.int()
        pos = torch.arange(n)
        k_cache[:, phys[pos // block_size], pos % block_size] = \
            torch.randn(num_kv_heads, n, head_dim, generator=gen).to(dtype)
        v_cache[:, phys[pos // block_size], pos % block_size] = \
            torch.randn(num_kv_heads, n, head_dim, generator=gen).to(dtype)
    query = (torch.randn(len(seq_lens), num_kv_heads * group, head_dim, generator=gen) * 2).to(dtype)
    return query, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32)


SEQ_LENS = [1, 7, 16, 17, 33, 130, 700, 2, 64]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("num_kv_heads,group", [(2, 1), (2, 3), (1, 4)])
def test_matches_reference(num_kv_heads, group, head_dim, block_size, window, dtype):
    query, k_cache, v_cache, block_tables, seq_lens = _case(
        SEQ_LENS, num_kv_heads, group, head_dim, block_size, dtype)
    scale = 1 / math.sqrt(head_dim)
    out = paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, scale, window)
    assert out.dtype == dtype and out.shape == query.shape
    assert torch.isfinite(out).all()
    # Reference on the (possibly bf16-rounded) inputs themselves.
    ref = _reference(query, k_cache, v_cache, block_tables, seq_lens, scale, window)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    else:
        # Values are O(1); bf16 output rounding alone is ~4e-3 relative.
        torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)


def test_out_argument_threads_and_strided_query():
    query, k_cache, v_cache, block_tables, seq_lens = _case([5, 300, 41], 2, 2, 64, 16,
                                                            torch.float32, seed=1)
    scale = 0.125
    ref = _reference(query, k_cache, v_cache, block_tables, seq_lens, scale, None)
    # Query as a view of a wider [S, 2 * Hq, D] tensor (e.g. a slice of a fused qkv output).
    wide = torch.cat([query, torch.full_like(query, float("nan"))], dim=1)
    strided = wide[:, :query.shape[1]]
    out = torch.empty_like(query)
    threads = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            out.fill_(float("nan"))
            assert paged_decode_attention(strided, k_cache, v_cache, block_tables, seq_lens,
                                          scale, out=out) is out
            torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(threads)


def test_bad_block_table_raises():
    query, k_cache, v_cache, block_tables, seq_lens = _case([20], 1, 1, 64, 16, torch.float32)
    block_tables[0, 1] = k_cache.shape[1]  # out of range
    with pytest.raises(RuntimeError, match="outside"):
        paged_decode_attention(query, k_cache, v_cache, block_tables, seq_lens, 0.125)
    with pytest.raises(RuntimeError, match="exceeds"):
        paged_decode_attention(query, k_cache, v_cache, block_tables[:, :1], seq_lens, 0.125)
