"""``paged_attention`` against the plain-torch reference, over small shapes.

bfloat16 note: Triton's interpreter computes ``tl.dot`` on bfloat16 operands
wrongly (errors of 1e10), so when interpreting the kernel upcasts bfloat16 dot
operands to float32, after rounding P to bfloat16 exactly as on GPU. These
tests therefore check the bfloat16 loads, masks, softmax and stores, but not
the GPU's bfloat16 MMA itself; that needs a CUDA run (TRITON_INTERPRET=0).
"""
import pytest
import torch

from paged_core.kernels import choose_num_splits, paged_attention

# (seq_lens, query_lens): a fresh prefill, a chunked prefill whose cached
# prefix ends mid-block, a decode, and a decode whose token opens a new block.
MIXED = ([19, 28, 45, 33], [19, 7, 1, 1])


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (8, 2), (8, 1), (6, 2)])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_gqa_ratios_and_block_sizes_mixed_batch(make_batch, check_attention, num_heads,
                                                num_kv_heads, block_size):
    """MHA, GQA 2/4, MQA and a non-power-of-two group (3), prefill and decode in one call."""
    check_attention(make_batch(*MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     block_size=block_size))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_dtypes_and_head_dims(make_batch, check_attention, dtype, head_dim):
    check_attention(make_batch(*MIXED, head_dim=head_dim, dtype=dtype))


@pytest.mark.parametrize("block_size", [64, 128])
def test_large_blocks(make_batch, check_attention, block_size):
    check_attention(make_batch([150, 70, 64], [30, 1, 64], block_size=block_size,
                               dtype=torch.float16))


def test_head_dim_not_power_of_two(make_batch, check_attention):
    """head_dim 80 (Phi-style) is padded to 128 lanes and masked."""
    check_attention(make_batch(*MIXED, head_dim=80))


@pytest.mark.parametrize("window", [1, 5, 16, 40, 1000])
def test_sliding_window(make_batch, check_attention, window):
    """Windows inside one tile, across tiles and blocks, and wider than any context."""
    check_attention(make_batch([70, 33, 90], [40, 1, 1], block_size=8), sliding_window=window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_logits_soft_cap(make_batch, check_attention, dtype, window, num_splits):
    """Gemma 2's soft cap: scores ``s`` become ``c * tanh(s / c)`` before the softmax. A cap
    below the scores' spread changes the result, so ignoring it would fail."""
    batch = make_batch(*MIXED, dtype=dtype)
    capped = check_attention(batch, window, logits_soft_cap=0.8, num_splits=num_splits)
    plain = check_attention(batch, window, num_splits=num_splits)
    assert (capped.float() - plain.float()).abs().max() > 0.05


@pytest.mark.parametrize("num_splits", [2, 3, 16])
@pytest.mark.parametrize("window", [None, 20])
def test_split_kv_forced(make_batch, check_attention, num_splits, window):
    """Flash-decoding path, including more splits than tiles (empty splits)."""
    batch = make_batch([300, 45, 130], [1, 1, 9], dtype=torch.float16, block_size=32)
    check_attention(batch, sliding_window=window, num_splits=num_splits)


def test_split_kv_mixed_prefill_batch(make_batch, check_attention):
    batch = make_batch(*MIXED, num_heads=8, num_kv_heads=2, dtype=torch.bfloat16)
    check_attention(batch, num_splits=4)


def test_long_prefill_spans_several_query_blocks(make_batch, check_attention):
    """Query blocks of 64/group rows: later blocks of a chunk must see earlier ones."""
    check_attention(make_batch([150, 20], [130, 20], num_heads=2, num_kv_heads=1))


def test_empty_query_and_padded_rows(make_batch, check_attention):
    """A sequence with no new tokens and query rows past query_start_loc[-1]."""
    check_attention(make_batch([40, 17, 25], [3, 0, 25], pad_tokens=5), num_splits=2)
    check_attention(make_batch([40, 17, 25], [3, 0, 25], pad_tokens=5))


def test_decode_hints_match_default(make_batch, check_attention):
    """The max_query_len/max_seq_len hints only change tiling, not results."""
    batch = make_batch([50, 90, 17], [1, 1, 1])
    check_attention(batch, max_query_len=1, max_seq_len=90)
    check_attention(batch, max_query_len=4)


def test_strided_query_view(make_batch, check_attention):
    """q taken as a slice of a fused QKV tensor (non-contiguous token stride)."""
    batch = make_batch(*MIXED)
    fused = torch.cat([batch.q, torch.randn_like(batch.q)], dim=1)
    batch.q = fused[:, :batch.q.shape[1]]
    assert not batch.q.is_contiguous()
    check_attention(batch)


def test_choose_num_splits():
    assert choose_num_splits(work_items=8, max_seq_len=32768, num_sms=132) == 32
    assert choose_num_splits(work_items=40, max_seq_len=4096, num_sms=132) == 7
    assert choose_num_splits(work_items=8, max_seq_len=512, num_sms=132) == 1  # short
    assert choose_num_splits(work_items=256, max_seq_len=32768, num_sms=132) == 1  # busy


def test_rejects_bad_arguments(make_batch):
    batch = make_batch([20], [4])
    args = (batch.k_cache, batch.v_cache, batch.block_tables, batch.seq_lens,
            batch.query_start_loc, batch.scale)
    with pytest.raises(ValueError, match="dtype"):
        paged_attention(batch.q.half(), *args)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention(batch.q[:, :3], *args)
    with pytest.raises(ValueError, match="sliding_window"):
        paged_attention(batch.q, *args, sliding_window=0)


@pytest.mark.parametrize("seed", range(10))
def test_random_batches(make_batch, check_attention, seed):
    """Random mixes of the axes above (shapes, dtype, window, split factor) in one batch."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[torch.randint(len(options), (1,), generator=gen).item()]

    num_seqs = pick([1, 2, 3, 5])
    seq_lens = torch.randint(1, 200, (num_seqs,), generator=gen).tolist()
    query_lens = [pick([1, 1, n, max(1, n // 3)]) for n in seq_lens]
    num_heads, num_kv_heads = pick([(2, 2), (4, 2), (8, 2), (4, 1), (6, 3)])
    batch = make_batch(seq_lens, query_lens, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=pick([16, 32, 64]), block_size=pick([8, 16, 32, 64]),
                       dtype=pick([torch.float32, torch.float16, torch.bfloat16]), seed=seed)
    check_attention(batch, sliding_window=pick([None, None, 7, 64]),
                    num_splits=pick([None, 1, 2, 5]))


def test_preallocated_out_keeps_padding_rows(make_batch, check_attention):
    """``out=`` is filled in place; rows past query_start_loc[-1] are not touched."""
    batch = make_batch([40, 9], [3, 9], pad_tokens=4)
    out = torch.full_like(batch.q, 7.0)
    result = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                             batch.seq_lens, batch.query_start_loc, batch.scale, out=out)
    assert result is out
    assert bool((out[batch.num_real_tokens:] == 7.0).all())
    check_attention(batch)
    expected = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                               batch.seq_lens, batch.query_start_loc, batch.scale)
    torch.testing.assert_close(out[:batch.num_real_tokens], expected[:batch.num_real_tokens])
