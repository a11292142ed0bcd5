"""A quantized KV cache (``kv_cache_dtype``, ``attention.kv_quant``): its rows' round trip
bounds; the C++ write (``write_kv_slots``) stores the bits of ``quantize``; the C++ kernel
decodes every code exactly; the torch backend (C++ kernel at every CPU level this machine
runs, and plain torch) matches the float64 reference over the dequantized cache; block
copies carry the scales."""
import dataclasses

import pytest
import torch

from paged_core.attention.cpu_kernels import cpu_paged_attention
from paged_core.attention.kv_quant import (QUANTIZED_DTYPES, SCALE_BYTES, cache_dtype,
                                           dequantize, kv_cache_row, quantize, written_codes)
from paged_core.attention.torch_backend import TorchAttentionBackend
from paged_core.kernels import reference

from .steps import step_metadata

BLOCK_SIZE, KV_HEADS, HEADS, DIM = 8, 2, 6, 64
KV_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# Worst |x - dequantize(quantize(x))| over a row's absmax: int8 rounds to half of
# absmax / 127; fp8 to half its relative step (2^-4 for e4m3's 3 mantissa bits, 2^-3 for e5m2).
ROUND_TRIP = {torch.int8: 0.5 / 127, torch.float8_e4m3fn: 2 ** -4, torch.float8_e5m2: 2 ** -3}


@pytest.mark.parametrize("dtype", QUANTIZED_DTYPES)
def test_round_trip_error_is_within_the_format_step(dtype):
    x = torch.randn(64, 3, DIM, generator=torch.Generator().manual_seed(0)) * 5
    x[0, 0] = 0  # an all-zero row: scale 0, decodes to zeros
    rows = quantize(x, dtype)
    assert rows.dtype == dtype and rows.shape == (64, 3, DIM + SCALE_BYTES)
    back = dequantize(rows)
    absmax = x.abs().amax(-1, keepdim=True)
    assert ((back - x).abs() <= ROUND_TRIP[dtype] * absmax * (1 + 1e-5)).all()
    assert (back[0, 0] == 0).all()
    # The row's absmax itself is representable: it comes back to float32 rounding.
    torch.testing.assert_close(back.abs().amax(-1), absmax[..., 0], rtol=1e-6, atol=0)


def test_cache_dtype_names_and_row_length():
    assert cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert cache_dtype("fp8", torch.float32) == torch.float8_e4m3fn
    assert kv_cache_row(64, torch.int8) == 68 and kv_cache_row(64, torch.float32) == 64
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        kv_cache_row(30, torch.int8)


def _step(seq_lens, query_lens, dtype, kv_dtype, pad=0, seed=0):
    """A head-major quantized paged cache (shuffled blocks) holding every context token, the
    new tokens written by the backend's ``write_kv``; the step's metadata and queries."""
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = reference.shuffled_block_tables(seq_lens, BLOCK_SIZE, 2, gen)
    shape = TorchAttentionBackend.kv_cache_shape(num_blocks, BLOCK_SIZE, KV_HEADS,
                                                 kv_cache_row(DIM, kv_dtype))
    k_cache, v_cache = (quantize(torch.randn(*shape[:3], DIM, generator=gen), kv_dtype)
                        for _ in range(2))
    assert k_cache.shape == shape
    meta = step_metadata(tables, seq_lens, query_lens, BLOCK_SIZE, pad)
    tokens = int(meta.query_start_loc[-1]) + pad
    query, key, value = (torch.randn(tokens, h, DIM, generator=gen).to(dtype)
                         for h in (HEADS, KV_HEADS, KV_HEADS))
    TorchAttentionBackend(cpu_kernel=False).write_kv(key, value, k_cache, v_cache, meta)
    return query, key, value, k_cache, v_cache, meta


def _expected(query, k_cache, v_cache, meta, window=None, soft_cap=None):
    """The float64 reference on the token-major view of the (dequantized) head-major cache."""
    return reference.paged_attention(
        query, k_cache.permute(1, 2, 0, 3), v_cache.permute(1, 2, 0, 3), meta.block_tables,
        meta.seq_lens, meta.query_start_loc, DIM ** -0.5, window, soft_cap)


MIXED = ([33, 5, 70, 12, 2], [1, 5, 20, 1, 1])  # decode, prefill, chunk after a prefix


@pytest.mark.parametrize("kv", list(KV_DTYPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (10, 1.5)])
def test_torch_backend_paths_match_the_reference_over_the_dequantized_cache(
        kv, dtype, window, soft_cap, cpu_isa):
    query, key, value, k_cache, v_cache, meta = _step(*MIXED, dtype, KV_DTYPES[kv], pad=3)
    real = meta.num_scheduled_tokens
    # The step's own K/V were stored quantized at their slots.
    heads, blocks, bs, row = k_cache.shape
    stored = k_cache.view(heads, blocks * bs, row)[:, meta.slot_mapping[:real]].transpose(0, 1)
    torch.testing.assert_close(dequantize(stored), dequantize(quantize(key[:real], k_cache.dtype)))
    expected = _expected(query, k_cache, v_cache, meta, window, soft_cap).float()[:real]
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    for cpu_kernel in (True, False):
        backend = TorchAttentionBackend(cpu_kernel=cpu_kernel)
        assert backend.uses_cpu_kernel(k_cache.device, dtype, k_cache.dtype) == cpu_kernel
        step_meta = dataclasses.replace(meta, backend_plans={})
        out = backend.attend(query, k_cache, v_cache, step_meta, DIM ** -0.5, window, soft_cap)
        torch.testing.assert_close(out[:real].float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dim", [64, 12])  # SIMD rows, and the scalar loop (12 % 8 != 0)
@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES)
def test_cpu_kernel_decodes_every_code_exactly(kv_dtype, dim, cpu_isa):
    """One key per sequence: attention returns its value row, code * scale, exactly."""
    values = written_codes(kv_dtype)
    rows = -(-len(values) // dim)
    values = torch.cat([values, torch.zeros(rows * dim - len(values))]).view(rows, 1, dim)
    scale = torch.full((rows, 1, 1), 0.75)
    cache = torch.cat([values.to(kv_dtype).view(torch.uint8),
                       scale.view(torch.uint8)], -1).view(kv_dtype)  # [rows, 1 head, dim + 4]
    cache = cache.view(rows, 1, 1, dim + SCALE_BYTES).transpose(0, 1).contiguous()  # 1 per block
    ones = torch.ones(rows, dtype=torch.int32)
    out = cpu_paged_attention(
        torch.randn(rows, 1, dim), cache, cache, torch.arange(rows, dtype=torch.int32)[:, None],
        ones, torch.arange(rows + 1, dtype=torch.int32), dim ** -0.5, cpu_isa=cpu_isa)
    assert torch.equal(out, values * 0.75)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES)
def test_cpu_write_stores_the_bits_of_kv_quant(kv_dtype, dtype, cpu_isa):
    """The C++ write (``write_kv_slots``, also the decoder stack's) against ``quantize``:
    random rows, an all-zero row, and codes at exact halves (int8 rounds them to even)."""
    query, key, value, k_cache, v_cache, meta = _step(*MIXED, dtype, kv_dtype, pad=3)
    key[0, 0] = 0
    key[1, 0] = torch.arange(DIM) + 0.5  # int8: absmax 63.5, scale 0.5, codes 1, 3, 5, ...
    key[2, 0, :2] = torch.tensor([127.0, 2.5])  # int8: scale 1, 2.5 rounds to 2
    caches = {}
    for cpu_kernel in (True, False):
        k, v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        TorchAttentionBackend(cpu_kernel=cpu_kernel).write_kv(key, value, k, v, meta)
        caches[cpu_kernel] = (k.view(torch.uint8), v.view(torch.uint8))
    for c, t in zip(caches[True], caches[False]):
        assert torch.equal(c, t)
    assert caches[True][0].any()


def test_block_copies_carry_the_scales():
    query, key, value, k_cache, v_cache, meta = _step([20], [20], torch.float32, torch.int8)
    src = meta.block_tables[0, :2].long()
    dst = torch.tensor(sorted(set(range(k_cache.shape[1])) - set(meta.block_tables[0].tolist())))
    assert len(dst) == 2  # the two unused blocks
    assert not torch.equal(k_cache[:, dst, :, DIM:], k_cache[:, src, :, DIM:])  # other scales
    TorchAttentionBackend().copy_blocks([k_cache], [v_cache], src, dst)
    for cache in (k_cache, v_cache):
        assert torch.equal(cache[:, dst].view(torch.uint8), cache[:, src].view(torch.uint8))
