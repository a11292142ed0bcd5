"""``write_kv_cache`` and ``copy_blocks`` against the plain-torch reference."""
import pytest
import torch

from paged_core.kernels import copy_blocks, reference, write_kv_cache

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device):
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return (torch.randn(shape).to(dtype).to(device), torch.randn(shape).to(dtype).to(device))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size,kv_heads,head_dim", [(8, 1, 64), (16, 2, 32), (32, 3, 48)])
def test_write_kv_cache_skips_negative_slots(device, dtype, block_size, kv_heads, head_dim):
    """Shuffled slots across blocks (some mid-block), with -1 padding slots mixed in."""
    num_blocks, num_tokens = 6, 20
    k_cache, v_cache = random_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[[3, 7, 19]] = -1
    key = torch.randn(num_tokens, kv_heads, head_dim).to(dtype).to(device)
    value = torch.randn(num_tokens, kv_heads, head_dim).to(dtype).to(device)
    before = k_cache.cpu().clone()
    k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
    reference.write_kv_cache(key.cpu(), value.cpu(), k_ref, v_ref, slots)
    write_kv_cache(key, value, k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)
    changed_slots = (k_ref != before).flatten(2).any(-1).sum().item()
    assert changed_slots == num_tokens - 3


def test_write_kv_cache_strided_views_and_int32_slots(device):
    """K/V sliced out of a fused QKV projection; int32 slot mapping."""
    k_cache, v_cache = random_cache(4, 16, 2, 32, torch.float16, device)
    qkv = torch.randn(10, 8, 32).half().to(device)
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([0, 5, 17, 18, 63, -1, 40, 33, 2, 50], dtype=torch.int32)
    k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
    reference.write_kv_cache(key.cpu(), value.cpu(), k_ref, v_ref, slots)
    write_kv_cache(key, value, k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)


def test_write_kv_cache_rejects_bad_shapes(device):
    k_cache, v_cache = random_cache(2, 16, 2, 32, torch.float32, device)
    key = torch.randn(3, 2, 32, device=device)
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_cache(key, key, k_cache, v_cache, torch.zeros(4, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="key/value"):
        write_kv_cache(key[:, :1], key[:, :1], k_cache, v_cache,
                       torch.zeros(3, dtype=torch.long, device=device))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size,kv_heads,head_dim", [(16, 2, 32), (64, 2, 64)])
def test_copy_blocks(device, dtype, block_size, kv_heads, head_dim):
    """Several pairs; the (64, 2, 64) block has 8192 elements, so two chunks per block."""
    k_cache, v_cache = random_cache(10, block_size, kv_heads, head_dim, dtype, device)
    src, dst = torch.tensor([7, 0, 3]), torch.tensor([2, 9, 5])
    k_ref, v_ref = k_cache.cpu().clone(), v_cache.cpu().clone()
    reference.copy_blocks(k_ref, v_ref, src, dst)
    copy_blocks(k_cache, v_cache, src.to(device), dst.to(device))
    assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)
    assert torch.equal(k_ref[2], k_ref[7]) and not torch.equal(k_ref[2], k_ref[1])


def test_cache_layout_is_validated(device):
    k_cache, v_cache = random_cache(4, 16, 2, 32, torch.float32, device)
    src = torch.tensor([0], device=device)
    with pytest.raises(ValueError, match="contiguous within a block"):
        copy_blocks(k_cache.transpose(1, 2), v_cache.transpose(1, 2), src, src)
    with pytest.raises(ValueError, match="power of two"):
        copy_blocks(k_cache[:, :12], v_cache[:, :12], src, src)
    with pytest.raises(ValueError, match="dtype"):
        copy_blocks(k_cache, v_cache.half(), src, src)
