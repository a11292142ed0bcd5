"""The C++ CPU paged-attention kernel matches the kernels' float64 reference on packed steps:
decodes, fresh prefills and chunks after a cached prefix mixed, GQA, sliding windows,
shuffled blocks, NaN in every slot no sequence owns, padding rows, bad arguments; on every
CPU path this host can run, bfloat16 tiles on vdpbf16ps and on AMX (``attention_path``
fixture)."""
import math

import pytest
import torch

from paged_core.attention.cpu_kernels import cpu_paged_attention
from paged_core.kernels import reference


def _step(seq_lens, query_lens, num_kv_heads, group, head_dim, block_size, dtype, pad=0, seed=0):
    """A head-major cache with shuffled blocks (NaN in unowned slots) and a packed query."""
    gen = torch.Generator().manual_seed(seed)
    block_tables, num_blocks = reference.shuffled_block_tables(seq_lens, block_size, 3, gen)
    shape = (num_kv_heads, num_blocks, block_size, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for i, n in enumerate(seq_lens):
        phys = block_tables[i].long()
        pos = torch.arange(n)
        for cache in (k_cache, v_cache):
            cache[:, phys[pos // block_size], pos % block_size] = \
                torch.randn(num_kv_heads, n, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0] + list(query_lens)).cumsum(0).to(torch.int32)
    query = (torch.randn(int(starts[-1]) + pad, num_kv_heads * group, head_dim, generator=gen)
             * 2).to(dtype)
    return query, k_cache, v_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32), starts


def _reference(query, k_cache, v_cache, block_tables, seq_lens, starts, scale, window,
               soft_cap=None):
    """The Triton kernels' float64 reference, on a token-major view of the head-major cache."""
    return reference.paged_attention(
        query.double(), k_cache.permute(1, 2, 0, 3).double(), v_cache.permute(1, 2, 0, 3).double(),
        block_tables, seq_lens, starts, scale, window, soft_cap)


# (context lengths, new tokens): decodes, fresh prefills, prefixes ending mid-block, long tiles.
STEPS = {
    "decodes": ([1, 7, 16, 17, 33, 130, 700, 2, 64], [1] * 9),
    "mixed": ([40, 5, 70, 12, 300, 2], [1, 5, 37, 1, 45, 2]),
    "prefills": ([3, 33, 100], [3, 33, 100]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5, 40])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("num_kv_heads,group", [(2, 1), (2, 3), (1, 4)])
@pytest.mark.parametrize("step", list(STEPS))
def test_matches_reference(step, num_kv_heads, group, head_dim, block_size, window, dtype,
                           attention_path):
    seq_lens, query_lens = STEPS[step]
    query, k_cache, v_cache, tables, lens, starts = _step(
        seq_lens, query_lens, num_kv_heads, group, head_dim, block_size, dtype)
    scale = 1 / math.sqrt(head_dim)
    out = cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, scale, window,
                              cpu_isa=attention_path)
    assert out.dtype == dtype and out.shape == query.shape
    assert torch.isfinite(out).all()
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, scale, window)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    else:  # values are O(1); bf16 output rounding alone is ~4e-3 relative
        torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("step", ["decodes", "mixed"])
def test_logits_soft_cap_matches_reference(step, head_dim, window, dtype, attention_path):
    """Gemma 2's soft cap (scores ``s`` -> ``c * tanh(s / c)``) on every path: float32, the
    bfloat16 tiles' vector tanh and the other levels' scalar one. A cap below the scores'
    spread changes the result, so ignoring it would fail."""
    seq_lens, query_lens = STEPS[step]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, 3, head_dim,
                                                          16, dtype)
    scale = 1 / math.sqrt(head_dim)
    out = cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, scale, window,
                              cpu_isa=attention_path, logits_soft_cap=1.5)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, scale, window, 1.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)
    uncapped = _reference(query, k_cache, v_cache, tables, lens, starts, scale, window)
    assert (uncapped - expected).abs().max() > 0.1
    with pytest.raises(ValueError, match="logits_soft_cap must be positive"):
        cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, scale,
                            logits_soft_cap=0.0, cpu_isa=attention_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_scores_climbing_along_the_keys_match_reference(head_dim, dtype, attention_path):
    """Keys leaning ever further along the queries' direction make each row's maximum climb
    by tens of log2 units per 64 keys, far past the AMX prompt path's lazy-rescaling margin
    (a row's outputs are rescaled only when its maximum moves by more than 2^8), so rows are
    rescaled segment after segment; keys leaning ever less keep the first maximum. Prompts,
    a chunk after a prefix and decodes match the reference on every path."""
    seq_lens, query_lens = [300, 260, 90], [300, 40, 1]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, 3, head_dim,
                                                          16, dtype, seed=9)
    gen = torch.Generator().manual_seed(10)
    direction = torch.randn(head_dim, generator=gen)
    direction /= direction.norm()
    query = (query.float() + 16 * direction).to(dtype)
    for i, (n, slope) in enumerate(zip(seq_lens, (0.12, -0.1, 0.12))):
        pos = torch.arange(n)
        phys = tables[i].long()[pos // 16]
        k_cache[:, phys, pos % 16] = (k_cache[:, phys, pos % 16].float()
                                      + (slope * pos)[:, None] * direction).to(dtype)
    scale = 1 / math.sqrt(head_dim)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, scale, None)
    logits = (query[:300, 0].double() @ k_cache[0, tables[0].long()[torch.arange(300) // 16],
                                                 torch.arange(300) % 16].double().T) * scale
    assert (logits[-1, 256:].max() - logits[-1, :64].max()) * math.log2(math.e) > 64
    out = cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, scale,
                              cpu_isa=attention_path)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


# Few sequences with long contexts: the bf16 tiles split a tile's keys into parts across
# threads (a lone long decode, a chunk after a long cached prefix, a window wider than a
# part) and combine them; short ones in the same step are not split. A bf16 tile of nq
# queries (up to 32) is cut every nq * 256 keys (every 256 in batch-invariant mode): the
# 16-query tile of "chunk_past_4096" crosses 4096, the 32- and 8-query tiles of
# "chunk_past_8192" 8192 and every 2048. On AMX tiles, "long_prompts" takes each tile width
# (paged_attention.cpp: 600 new tokens after a 40-token prefix in tiles of 128 queries where
# their outputs fit, 300 in tiles of 64, a decode).
LONG_STEPS = {
    "lone_decode": ([2100], [1]),
    "chunk_after_prefix": ([1500, 3], [16, 3]),
    "chunk_past_4096": ([4200, 5], [16, 5]),
    "chunk_past_8192": ([8300], [40]),
    "mixed": ([2100, 9, 1300, 600], [1, 9, 20, 1]),
    "long_prompts": ([640, 300, 7], [600, 300, 1]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 40, 700])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("step", list(LONG_STEPS))
def test_long_contexts_match_reference(step, head_dim, window, dtype, attention_path):
    seq_lens, query_lens = LONG_STEPS[step]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, 3, head_dim,
                                                          16, dtype, pad=2, seed=2)
    scale = 1 / math.sqrt(head_dim)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, scale, window)
    real = int(starts[-1])
    threads = torch.get_num_threads()
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            out = torch.full_like(query, 7.0)
            cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, scale, window,
                                out=out, cpu_isa=attention_path)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out[:real].double(), expected[:real], rtol=tol, atol=tol)
            assert (out[real:] == 7.0).all()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 700])
def test_a_long_sequence_gets_the_same_bits_alone_or_batched_on_any_thread_count(window, dtype,
                                                                                  attention_path):
    """Where split-KV cuts a long context depends on its own positions only, so the result of
    a sequence does not change with the rest of the step or the threads (batch-invariant mode)."""
    seq_lens, query_lens = LONG_STEPS["mixed"]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, 3, 64, 16,
                                                          dtype, seed=3)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            batched = cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125,
                                          window, cpu_isa=attention_path)
            for s in range(len(seq_lens)):  # each sequence alone
                rows = slice(int(starts[s]), int(starts[s + 1]))
                own_start = torch.tensor([0, rows.stop - rows.start], dtype=starts.dtype)
                alone = cpu_paged_attention(query[rows], k_cache, v_cache, tables[s:s + 1],
                                            lens[s:s + 1], own_start, 0.125, window,
                                            cpu_isa=attention_path)
                assert torch.equal(alone, batched[rows]), f"sequence {s} on {n} threads"
            results.append(batched)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(r, results[0]) for r in results)


@pytest.mark.parametrize("window", [None, 40])
# head_dim 128 with 4 and 8 query heads per KV head: outputs partly in L1, not in registers
@pytest.mark.parametrize("head_dim,group", [(64, 3), (64, 4), (128, 2), (128, 4), (128, 8)])
def test_decode_loop_matches_the_tiles_and_can_be_left_out(head_dim, group, window):
    """The avx512_bf16 build's one-query units take their own loop (attention_decode_bf16.h):
    it matches the reference and the tiles to bfloat16 rounding; with ``decode_loop=False``
    a prompt's last token gets the same bits alone as inside its chunk (batch-invariant mode
    relies on that)."""
    from paged_core.cpu.extension import cpu_extension_available

    if not cpu_extension_available("avx512_bf16"):
        pytest.skip("the decode loop is the avx512_bf16 build's: this CPU has no AVX512-BF16")
    seq_lens, query_lens = [40, 300, 17], [8, 1, 17]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, group,
                                                          head_dim, 16, torch.bfloat16, seed=5)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, 0.125, window)
    outs = {loop: cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125,
                                      window, cpu_isa="avx512_bf16", amx_tiles=False,
                                      decode_loop=loop) for loop in (True, False)}
    for out in outs.values():
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(outs[True].float(), outs[False].float(), atol=2e-2, rtol=2e-2)
    last = int(starts[1]) - 1  # sequence 0's last prompt token, alone as a one-token chunk
    alone = cpu_paged_attention(query[last:last + 1], k_cache, v_cache, tables[:1], lens[:1],
                                torch.tensor([0, 1], dtype=torch.int32), 0.125, window,
                                cpu_isa="avx512_bf16", amx_tiles=False, decode_loop=False)
    assert torch.equal(alone[0], outs[False][last])


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim,group", [(64, 3), (128, 4)])
def test_both_kv_prefetch_policies_give_the_same_bits(head_dim, group, block_size):
    """How the decode loop starts K and V into L2 (``PAGED_CORE_CPU_KV_PREFETCH``: every line,
    or each run's first line) moves no data it computes with: the same bits, on vdpbf16ps and
    (where granted) AMX scores, and both match the reference."""
    from paged_core.attention.cpu_kernels import bf16_attention_amx
    from paged_core.cpu.extension import cpu_extension_available

    if not cpu_extension_available("avx512_bf16"):
        pytest.skip("the decode loop is the avx512_bf16 build's: this CPU has no AVX512-BF16")
    seq_lens, query_lens = [900, 300, 47, 130], [1, 1, 1, 20]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, group,
                                                          head_dim, block_size, torch.bfloat16,
                                                          seed=11)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, 0.125, None)
    for amx_tiles in sorted({False, bf16_attention_amx("avx512_bf16")}):
        outs = [cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125,
                                    cpu_isa="avx512_bf16", amx_tiles=amx_tiles,
                                    kv_prefetch=policy) for policy in ("every_line", "first_line")]
        assert torch.equal(outs[0], outs[1])
        torch.testing.assert_close(outs[0].double(), expected, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="kv_prefetch='some_lines' is not a KV prefetch policy"):
        cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125,
                            cpu_isa="avx512_bf16", kv_prefetch="some_lines")


def _skip_without_amx_attention() -> None:
    from paged_core.attention.cpu_kernels import bf16_attention_amx

    try:
        amx = bf16_attention_amx("avx512_bf16")
    except (ValueError, RuntimeError) as refused:
        pytest.skip(f"no AMX attention here: {refused}")
    if not amx:
        pytest.skip("no AMX attention here: this CPU lacks amx_bf16 or AVX512-BF16")


def test_with_amx_tiles_decodes_keep_the_decode_loop_unless_it_is_left_out():
    """On AMX tiles, one-query units still take the decode loop (a decode's few query rows
    would fill a sliver of a tile; its scores come from tiles, attention_decode_amx.h): as
    close as without the tiles, while prompt tiles run on AMX; with ``decode_loop=False``
    every query is on the tiles, and a prompt's last token gets the same bits alone as inside
    its chunk."""
    _skip_without_amx_attention()
    seq_lens, query_lens = [600, 300, 90], [200, 1, 1]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, 3, 64, 16,
                                                          torch.bfloat16, seed=6)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, 0.125, None)

    def attend(amx_tiles, decode_loop, rows=slice(None), seqs=slice(None), starts=starts):
        return cpu_paged_attention(query[rows], k_cache, v_cache, tables[seqs], lens[seqs], starts,
                                   0.125, cpu_isa="avx512_bf16", amx_tiles=amx_tiles,
                                   decode_loop=decode_loop)

    tiles, plain = attend(True, True), attend(False, True)
    torch.testing.assert_close(tiles.double(), expected, atol=2e-2, rtol=2e-2)
    decodes = [int(starts[1]), int(starts[2])]
    torch.testing.assert_close(tiles[decodes].float(), plain[decodes].float(), atol=2e-2,
                               rtol=2e-2)
    # the prompt's tiles ran on AMX: tdpbf16ps rounds a few of its 76800 outputs differently
    assert not torch.equal(tiles[:200], plain[:200])
    invariant = attend(True, False)
    torch.testing.assert_close(invariant.double(), expected, atol=2e-2, rtol=2e-2)
    last = int(starts[1]) - 1  # sequence 0's last prompt token, alone as a one-token chunk
    alone = attend(True, False, slice(last, last + 1), slice(0, 1),
                   torch.tensor([0, 1], dtype=torch.int32))
    assert torch.equal(alone[0], invariant[last])


@pytest.mark.parametrize("head_dim,group", [(64, 1), (64, 3), (64, 4), (128, 2), (128, 4),
                                            (128, 8)])
def test_decodes_on_amx_tiles_match_the_reference_and_keep_their_bits_alone(head_dim, group):
    """With AMX tiles, decodes of up to 4 query heads per KV head take their scores from
    tiles (attention_decode_amx.h; 8 stay on vdpbf16ps): they match the reference to bfloat16
    rounding, beside a prompt, with a window, over shuffled blocks, and a decode alone gets
    the same bits as inside the step."""
    _skip_without_amx_attention()
    seq_lens, query_lens = [70, 300, 17, 1000], [30, 1, 1, 1]
    query, k_cache, v_cache, tables, lens, starts = _step(seq_lens, query_lens, 2, group,
                                                          head_dim, 16, torch.bfloat16, seed=9)
    for window in (None, 40):
        expected = _reference(query, k_cache, v_cache, tables, lens, starts, 0.125, window)
        out = cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125, window,
                                  cpu_isa="avx512_bf16", amx_tiles=True)
        torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
        for s in (1, 3):
            row = int(starts[s])
            alone = cpu_paged_attention(query[row:row + 1], k_cache, v_cache, tables[s:s + 1],
                                        lens[s:s + 1], torch.tensor([0, 1], dtype=torch.int32),
                                        0.125, window, cpu_isa="avx512_bf16", amx_tiles=True)
            assert torch.equal(alone[0], out[row])


def test_out_argument_padding_rows_threads_strided_query_and_int64_indices(cpu_isa):
    query, k_cache, v_cache, tables, lens, starts = _step([5, 300, 41], [5, 20, 1], 2, 2, 64, 16,
                                                          torch.float32, pad=3, seed=1)
    expected = _reference(query, k_cache, v_cache, tables, lens, starts, 0.125, None)
    # The query as a view of a wider [T, 2 * Hq, D] tensor (a slice of a fused qkv output).
    wide = torch.cat([query, torch.full_like(query, float("nan"))], dim=1)
    strided = wide[:, :query.shape[1]]
    real = int(starts[-1])
    out = torch.empty_like(query)
    threads = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            out.fill_(7.0)
            assert cpu_paged_attention(strided, k_cache, v_cache, tables, lens, starts, 0.125,
                                       out=out, cpu_isa=cpu_isa) is out
            torch.testing.assert_close(out[:real].double(), expected[:real], rtol=1e-5, atol=1e-5)
            assert (out[real:] == 7.0).all()  # padding rows are left alone
    finally:
        torch.set_num_threads(threads)
    # A query whose last dim is strided, and int64 index tensors: the op makes its own copies.
    last_dim_strided = query.transpose(1, 2).contiguous().transpose(1, 2)
    assert last_dim_strided.stride(-1) != 1
    out = cpu_paged_attention(last_dim_strided, k_cache, v_cache, tables.long(), lens.long(),
                              starts.long(), 0.125, cpu_isa=cpu_isa)
    torch.testing.assert_close(out[:real].double(), expected[:real], rtol=1e-5, atol=1e-5)


def test_inconsistent_arguments_raise(cpu_isa):
    query, k_cache, v_cache, tables, lens, starts = _step([20, 9], [4, 9], 1, 1, 64, 16,
                                                          torch.float32)
    bad_table = tables.clone()
    bad_table[0, 1] = k_cache.shape[1]  # out of range
    with pytest.raises(RuntimeError, match="outside"):
        cpu_paged_attention(query, k_cache, v_cache, bad_table, lens, starts, 0.125)
    with pytest.raises(RuntimeError, match="exceeds"):
        cpu_paged_attention(query, k_cache, v_cache, tables[:, :1], lens, starts, 0.125)
    with pytest.raises(RuntimeError, match="new tokens but a context of"):
        cpu_paged_attention(query, k_cache, v_cache, tables, torch.tensor([20, 5]), starts, 0.125)
    with pytest.raises(RuntimeError, match="end within the query rows"):
        cpu_paged_attention(query[:5], k_cache, v_cache, tables, lens, starts, 0.125)
    with pytest.raises(ValueError, match="sliding_window must be positive"):
        cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125, 0)


def test_the_attention_setting_picks_the_tiles_and_refuses_what_cannot_run(monkeypatch):
    """``PAGED_CORE_CPU_ATTENTION``: ``auto`` takes AMX only where the CPU has it; an unknown
    value, or ``amx`` on a CPU without AMX-BF16, is an error naming the setting."""
    from paged_core.attention.cpu_kernels import bf16_attention_amx
    from paged_core.cpu import isa

    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "onednn")
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_ATTENTION='onednn' is not a bfloat16 "
                                         "attention kernel; choose auto or one of bf16_dot, amx"):
        bf16_attention_amx("avx512_bf16")
    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "bf16_dot")
    assert not bf16_attention_amx("avx512_bf16")
    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "amx")
    assert not bf16_attention_amx("avx2")  # only the avx512_bf16 build has the tiles

    monkeypatch.setattr(isa, "has_amx_bf16", lambda: False)
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_ATTENTION=amx: this CPU lacks amx_bf16; "
                                         "choose auto or bf16_dot"):
        bf16_attention_amx("avx512_bf16")
    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "auto")
    assert not bf16_attention_amx("avx512_bf16")


def test_without_the_os_granting_tiles_auto_attention_keeps_vdpbf16ps(amx_cpu_without_tile_state,
                                                                      monkeypatch):
    from paged_core.attention.cpu_kernels import bf16_attention_amx

    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "auto")
    assert not bf16_attention_amx("avx512_bf16")
    monkeypatch.setenv("PAGED_CORE_CPU_ATTENTION", "amx")
    with pytest.raises(RuntimeError, match="PAGED_CORE_CPU_ATTENTION=amx: the OS did not grant"):
        bf16_attention_amx("avx512_bf16")


def test_amx_tiles_are_refused_by_a_build_without_them(cpu_isa):
    if cpu_isa == "avx512_bf16":
        pytest.skip("the avx512_bf16 build has AMX tiles where the CPU does")
    query, k_cache, v_cache, tables, lens, starts = _step([20, 9], [4, 9], 1, 1, 64, 16,
                                                          torch.bfloat16)
    with pytest.raises(RuntimeError, match="amx_tiles: this build has no AMX attention"):
        cpu_paged_attention(query, k_cache, v_cache, tables, lens, starts, 0.125,
                            cpu_isa=cpu_isa, amx_tiles=True)
