"""The torch attention backend (the CPU path): its C++-kernel and plain-torch paths agree
with the float64 reference on mixed steps (padding rows included), through the engine's
metadata."""
import dataclasses

import pytest
import torch

from paged_core.attention import select_backend
from paged_core.attention.torch_backend import TorchAttentionBackend
from paged_core.kernels import reference

from .steps import step_metadata

BLOCK_SIZE, KV_HEADS, HEADS, DIM = 8, 2, 6, 64


def _step(seq_lens, query_lens, dtype, pad=0, seed=0):
    """A filled head-major paged cache (shuffled blocks) and the metadata of one packed step,
    with ``pad`` padding rows (slot -1) after the real tokens."""
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = reference.shuffled_block_tables(seq_lens, BLOCK_SIZE, 2, gen)
    shape = TorchAttentionBackend.kv_cache_shape(num_blocks, BLOCK_SIZE, KV_HEADS, DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    meta = step_metadata(tables, seq_lens, query_lens, BLOCK_SIZE, pad)
    query = torch.randn(int(meta.query_start_loc[-1]) + pad, HEADS, DIM, generator=gen).to(dtype)
    return query, k_cache, v_cache, meta


def _expected(query, k_cache, v_cache, meta, window, soft_cap=None):
    """The kernels' float64 reference, on the token-major view of the head-major cache."""
    return reference.paged_attention(
        query, k_cache.permute(1, 2, 0, 3), v_cache.permute(1, 2, 0, 3), meta.block_tables,
        meta.seq_lens, meta.query_start_loc, DIM ** -0.5, window, soft_cap)


STEPS = {
    "decodes only": ([1, 9, 40, 17, 130], [1, 1, 1, 1, 1]),
    "mixed": ([33, 5, 70, 12, 2], [1, 5, 20, 1, 1]),  # decode, prefill, chunk after a prefix
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,soft_cap", [(None, None), (10, None), (None, 1.5)])
@pytest.mark.parametrize("step", list(STEPS))
def test_kernel_and_plain_torch_paths_match_the_reference(step, window, soft_cap, dtype, cpu_isa):
    query, k_cache, v_cache, meta = _step(*STEPS[step], dtype, pad=3)
    real = meta.num_scheduled_tokens
    expected = _expected(query, k_cache, v_cache, meta, window, soft_cap).float()[:real]
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    for cpu_kernel in (True, False):
        backend = TorchAttentionBackend(cpu_kernel=cpu_kernel)
        assert backend.uses_cpu_kernel(k_cache.device, k_cache.dtype) == cpu_kernel
        assert backend.cpu_isa == (cpu_isa if cpu_kernel else None)  # the user's setting
        step_meta = dataclasses.replace(meta, backend_plans={})
        out = backend.attend(query, k_cache, v_cache, step_meta, DIM ** -0.5, window, soft_cap)
        assert bool(step_meta.backend_plans) != cpu_kernel  # the kernel needs no per-step plan
        torch.testing.assert_close(out[:real].float(), expected, atol=tolerance, rtol=tolerance)
        assert (out[real:] == 0).all()


def test_float16_takes_the_plain_torch_path_and_cpu_engines_get_the_kernel(cpu_isa):
    assert select_backend("torch", torch.device("cpu")).cpu_kernel
    query, k_cache, v_cache, meta = _step(*STEPS["mixed"], torch.float16)
    backend = TorchAttentionBackend()
    assert not backend.uses_cpu_kernel(k_cache.device, k_cache.dtype)
    out = backend.attend(query, k_cache, v_cache, meta, DIM ** -0.5)
    torch.testing.assert_close(out.float(), _expected(query, k_cache, v_cache, meta, None).float(),
                               atol=4e-3, rtol=4e-3)
