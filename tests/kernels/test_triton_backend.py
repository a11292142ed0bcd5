"""``TritonAttentionBackend`` through ``AttentionMetadata``, as the model runner uses it."""
import pytest
import torch

from paged_core.attention import AttentionMetadata, select_backend
from paged_core.attention.kv_quant import kv_cache_row, quantize
from paged_core.attention.triton_backend import TritonAttentionBackend
from paged_core.kernels import reference


def metadata(seq_lens, query_lens, block_tables, block_size, device, pad_tokens=0):
    """Slot mapping for each sequence's new tokens; ``pad_tokens`` extra rows get slot -1."""
    slots = []
    for i, (n, q_len) in enumerate(zip(seq_lens, query_lens)):
        pos = torch.arange(n - q_len, n)
        slots.append(block_tables[i, pos // block_size].long() * block_size + pos % block_size)
    slots.append(torch.full((pad_tokens,), -1, dtype=torch.long))
    starts = torch.tensor([0] + query_lens).cumsum(0).to(torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.cat(slots).to(device), block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=starts.to(device), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), seq_lens_cpu=list(seq_lens), query_lens_cpu=list(query_lens))


def test_backend_step_over_two_layers(device):
    """Write a step's K/V then attend, per layer; then copy-on-write a block in every layer."""
    backend = select_backend("triton", device)
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"
    block_size, kv_heads, heads, dim, num_blocks = 8, 2, 4, 32, 12
    seq_lens, query_lens = [21, 9, 30], [5, 9, 1]  # chunked prefill, prefill, decode
    tables = torch.tensor([[3, 7, 1, 0], [10, 2, 0, 0], [4, 11, 6, 8]], dtype=torch.int32)
    meta = metadata(seq_lens, query_lens, tables, block_size, device, pad_tokens=2)
    num_tokens = meta.slot_mapping.shape[0]
    shape = (num_blocks, block_size, kv_heads, dim)
    layers = [(torch.randn(shape, dtype=torch.float16).to(device),
               torch.randn(shape, dtype=torch.float16).to(device)) for _ in range(2)]
    for k_cache, v_cache in layers:
        key, value = (torch.randn(num_tokens, kv_heads, dim).half().to(device) for _ in range(2))
        query = torch.randn(num_tokens, heads, dim).half().to(device)
        k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
        reference.write_kv_cache(key.cpu(), value.cpu(), k_ref, v_ref, meta.slot_mapping.cpu())
        backend.write_kv(key, value, k_cache, v_cache, meta)
        assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)

        out = backend.attend(query, k_cache, v_cache, meta, scale=dim ** -0.5, sliding_window=12)
        expected = reference.paged_attention(
            query.cpu(), k_ref, v_ref, tables, meta.seq_lens.cpu(), meta.query_start_loc.cpu(),
            dim ** -0.5, sliding_window=12)
        real = sum(query_lens)
        torch.testing.assert_close(out[:real].cpu(), expected[:real], atol=2e-3, rtol=4e-3)

    src, dst = torch.tensor([7, 11]), torch.tensor([5, 9])  # host tensors are moved over
    backend.copy_blocks([k for k, _ in layers], [v for _, v in layers], src, dst)
    for k_cache, v_cache in layers:
        assert torch.equal(k_cache[5], k_cache[7]) and torch.equal(v_cache[9], v_cache[11])


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=str)
def test_backend_step_writes_attends_and_copies_a_quantized_cache(device, kv_dtype):
    """``TritonAttentionBackend`` as the model runner drives it, over the shape it allocates."""
    backend = TritonAttentionBackend()
    block_size, kv_heads, heads, dim, num_blocks = 8, 2, 4, 32, 12
    seq_lens, query_lens = [21, 9, 30], [5, 9, 1]  # chunked prefill, prefill, decode
    tables = torch.tensor([[3, 7, 1, 0], [10, 2, 0, 0], [4, 11, 6, 8]], dtype=torch.int32)
    meta = metadata(seq_lens, query_lens, tables, block_size, device, pad_tokens=2)
    shape = backend.kv_cache_shape(num_blocks, block_size, kv_heads, kv_cache_row(dim, kv_dtype))
    k_cache, v_cache = (quantize(torch.randn(*shape[:3], dim), kv_dtype).to(device)
                        for _ in range(2))
    num_tokens = meta.slot_mapping.shape[0]
    key, value = (torch.randn(num_tokens, kv_heads, dim, device=device) for _ in range(2))
    query = torch.randn(num_tokens, heads, dim, device=device)
    k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
    reference.write_kv_cache(key.cpu(), value.cpu(), k_ref, v_ref, meta.slot_mapping.cpu())
    backend.write_kv(key, value, k_cache, v_cache, meta)
    assert torch.equal(k_cache.cpu().view(torch.uint8), k_ref.view(torch.uint8))
    out = backend.attend(query, k_cache, v_cache, meta, scale=dim ** -0.5, sliding_window=12)
    expected = reference.paged_attention(query.cpu(), k_ref, v_ref, tables, meta.seq_lens.cpu(),
                                         meta.query_start_loc.cpu(), dim ** -0.5, 12)
    real = sum(query_lens)
    torch.testing.assert_close(out[:real].cpu(), expected[:real], atol=1e-5, rtol=1e-5)
    backend.copy_blocks([k_cache], [v_cache], torch.tensor([3]), torch.tensor([5]))
    assert torch.equal(k_cache[5].cpu().view(torch.uint8), k_ref[3].view(torch.uint8))
