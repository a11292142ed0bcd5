"""The Triton kernels over a quantized KV cache
(``paged_core.attention.kv_quant``: rows of ``head_dim`` int8/fp8 codes and a float32 scale):
writes and block copies equal the reference byte for byte, attention matches the float64
reference over the dequantized cache, and every code decodes exactly (the backend's step:
``test_triton_backend.py``)."""
from types import SimpleNamespace

import pytest
import torch

from paged_core.attention.kv_quant import QUANTIZED_DTYPES, SCALE_BYTES, as_bytes, max_code, \
    quantize, written_codes
from paged_core.kernels import copy_blocks, paged_attention, reference, write_kv_cache


@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES, ids=str)
def test_write_and_copy_blocks_equal_the_reference(device, kv_dtype):
    num_blocks, block_size, kv_heads, head_dim, num_tokens = 6, 8, 2, 32, 20
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = (quantize(torch.randn(shape), kv_dtype).to(device) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[3, 7]] = -1
    key, value = (torch.randn(num_tokens, kv_heads, head_dim).to(device) for _ in range(2))
    k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
    reference.write_kv_cache(key.cpu(), value.cpu(), k_ref, v_ref, slots)
    write_kv_cache(key, value, k_cache, v_cache, slots.to(device))
    as_bytes = [c.cpu().view(torch.uint8) for c in (k_cache, v_cache, k_ref, v_ref)]
    assert torch.equal(as_bytes[0], as_bytes[2]) and torch.equal(as_bytes[1], as_bytes[3])
    src, dst = torch.tensor([0, 4]), torch.tensor([5, 1])
    reference.copy_blocks(k_ref, v_ref, src, dst)
    copy_blocks(k_cache, v_cache, src.to(device), dst.to(device))
    assert torch.equal(k_cache.cpu().view(torch.uint8), k_ref.view(torch.uint8))
    assert torch.equal(v_cache.cpu().view(torch.uint8), v_ref.view(torch.uint8))
    assert torch.equal(k_ref[5].view(torch.uint8), k_ref[0].view(torch.uint8))  # scales too


@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("window,soft_cap", [(None, None), (20, 1.5)])
def test_attention_matches_the_reference_over_the_dequantized_cache(
        make_batch, check_attention, kv_dtype, dtype, window, soft_cap):
    """A mixed step (decodes, a prefill, a chunk after a prefix, padding rows); the caches'
    slots outside every context are NaN, so a read of one shows."""
    batch = make_batch([1, 40, 77, 5], [1, 1, 30, 5], num_heads=6, num_kv_heads=2, pad_tokens=2)
    quantized = {name: quantize(getattr(batch, name).cpu(), kv_dtype).to(batch.q.device)
                 for name in ("k_cache", "v_cache")}
    check_attention(SimpleNamespace(**{**vars(batch), **quantized, "q": batch.q.to(dtype)}),
                    window, soft_cap)


@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES, ids=str)
def test_every_code_decodes_exactly(device, kv_dtype):
    """One key per sequence: attention returns its value row, code * scale, exactly."""
    dim, block_size = 32, 8
    values = written_codes(kv_dtype)
    seqs = -(-len(values) // dim)
    values = torch.cat([values, torch.zeros(seqs * dim - len(values))]).view(seqs, 1, dim)
    rows = torch.cat([values.to(kv_dtype).view(torch.uint8),
                      torch.full((seqs, 1, 1), 0.75).view(torch.uint8)], -1)
    cache = torch.zeros(seqs, block_size, 1, dim + SCALE_BYTES, dtype=torch.uint8)
    cache[:, 0] = rows  # sequence i: one key, slot 0 of block i
    cache = cache.view(kv_dtype).to(device)
    out = paged_attention(
        torch.randn(seqs, 1, dim, device=device), cache, cache,
        torch.arange(seqs, dtype=torch.int32, device=device)[:, None],
        torch.ones(seqs, dtype=torch.int32, device=device),
        torch.arange(seqs + 1, dtype=torch.int32, device=device), dim ** -0.5)
    assert torch.equal(out.cpu(), values * 0.75)


@pytest.mark.parametrize("kv_dtype", QUANTIZED_DTYPES, ids=str)
def test_scales_are_correctly_rounded_quotients(device, kv_dtype):
    """A row's scale is absmax / max_code rounded once, on every device, so caches written on
    a GPU hold the bits the CPU reference does (CUDA divides by a host scalar through its
    reciprocal, which once put some GPU scales 1 ulp off)."""
    x = torch.randn(4096, 32, device=device) * 3
    scales = as_bytes(quantize(x, kv_dtype))[..., -4:].contiguous().view(torch.float32)
    amax = x.abs().amax(dim=-1, keepdim=True).cpu()
    assert torch.equal(scales.cpu(), (amax.double() / max_code(kv_dtype)).float())
