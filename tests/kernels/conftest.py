"""Shared set-up for the kernel tests.

The kernels run in Triton's CPU interpreter unless ``TRITON_INTERPRET=0`` is
set explicitly on a CUDA machine. The variable must be set before
``paged_core.kernels`` is first imported (``@triton.jit`` reads it then),
hence at the very top of this file.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from paged_core.kernels import paged_attention, reference  # noqa: E402
from paged_core.kernels._checks import interpreting  # noqa: E402

# Tolerances against the float64 reference: float32 uses IEEE dots; float16 and
# bfloat16 round P to the cache dtype before P @ V and round the output, so
# they may differ by about one output ulp.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 4e-3),
              torch.bfloat16: (1.6e-2, 1.6e-2)}


@pytest.fixture
def device() -> torch.device:
    if interpreting():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.fail("TRITON_INTERPRET=0 needs a CUDA device")
    return torch.device("cuda")


@pytest.fixture
def make_batch(device):
    """Factory for a packed attention step over a paged cache.

    Sequence ``i`` has ``seq_lens[i]`` context tokens of which the last
    ``query_lens[i]`` are new. Physical blocks are a random permutation (so
    tables are shuffled), ``extra_blocks`` blocks belong to no sequence, and
    every cache slot outside a sequence's context is NaN: any read of it that
    leaks into the result shows up as NaN. ``pad_tokens`` adds query rows past
    ``query_start_loc[-1]`` (a padded batch).
    """
    def build(seq_lens, query_lens, *, num_heads=4, num_kv_heads=2, head_dim=32,
              block_size=16, dtype=torch.float32, extra_blocks=3, pad_tokens=0, seed=0):
        gen = torch.Generator().manual_seed(seed)
        table, num_blocks = reference.shuffled_block_tables(seq_lens, block_size, extra_blocks, gen)
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k_cache = torch.full(shape, float("nan"), dtype=dtype)
        v_cache = torch.full(shape, float("nan"), dtype=dtype)
        for i, n in enumerate(seq_lens):
            nb = -(-n // block_size)
            for cache in (k_cache, v_cache):
                ctx = torch.randn(nb * block_size, num_kv_heads, head_dim, generator=gen)
                ctx[n:] = float("nan")
                cache[table[i, :nb].long()] = ctx.view(nb, block_size, num_kv_heads,
                                                       head_dim).to(dtype)
        starts = [0]
        for q_len in query_lens:
            starts.append(starts[-1] + q_len)
        q = torch.randn(starts[-1] + pad_tokens, num_heads, head_dim, generator=gen)
        return SimpleNamespace(
            q=q.to(dtype).to(device), k_cache=k_cache.to(device), v_cache=v_cache.to(device),
            block_tables=table.to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            scale=head_dim ** -0.5, num_real_tokens=starts[-1])
    return build


@pytest.fixture
def check_attention():
    """Run ``paged_attention`` on a ``make_batch`` batch and compare with the reference.

    Rows past ``query_start_loc[-1]`` are unspecified and not compared.
    """
    def check(batch, sliding_window=None, logits_soft_cap=None, **kwargs):
        out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.block_tables,
                              batch.seq_lens, batch.query_start_loc, batch.scale,
                              sliding_window, logits_soft_cap=logits_soft_cap, **kwargs)
        expected = reference.paged_attention(
            batch.q.cpu(), batch.k_cache.cpu(), batch.v_cache.cpu(), batch.block_tables.cpu(),
            batch.seq_lens.cpu(), batch.query_start_loc.cpu(), batch.scale, sliding_window,
            logits_soft_cap)
        n = batch.num_real_tokens
        assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
        atol, rtol = TOLERANCES[batch.q.dtype]
        torch.testing.assert_close(out[:n].cpu().float(), expected[:n].float(),
                                   atol=atol, rtol=rtol)
        return out[:n]
    return check
