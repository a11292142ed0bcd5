"""The fused Triton elementwise kernels (``paged_core.kernels.elementwise``, what CUDA models
run) against plain torch (``TorchOps``, the reference): float32 to rounding, bfloat16 to a
bfloat16 tolerance (``assert_matches``); strided q/k views rotated in place, partial rotary,
the residual updated in place."""
import pytest
import torch

from paged_core.models.elementwise import TORCH_OPS, TritonOps

DTYPES = [torch.float32, torch.bfloat16]


def assert_matches(ours: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 within 2e-6 relative; bfloat16 within a few bfloat16 units of inputs of
    magnitude up to ~10: where torch rounds each product, Triton's interpreter truncates and
    the GPU compiler may keep products in float32 (the rotary's differences cancel to tens of
    units of a small result, seen on an H200)."""
    ours, expected = ours.cpu(), expected.cpu()
    if expected.dtype == torch.float32:
        torch.testing.assert_close(ours, expected, rtol=2e-6, atol=2e-6)
    else:
        torch.testing.assert_close(ours.float(), expected.float(), rtol=2e-2, atol=6e-2)


@pytest.fixture
def ops(device):
    return TritonOps()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_and_the_residual_add(ops, device, dtype):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(7, 96, generator=gen).to(dtype).to(device) for _ in range(2))
    weight = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype).to(device)
    assert_matches(ops.rms_norm(x, weight, 1e-6), TORCH_OPS.rms_norm(x, weight, 1e-6))
    expected_residual, expected = TORCH_OPS.add_rms_norm(residual.clone(), x, weight, 1e-6)
    kept = residual.clone()
    new_residual, normed = ops.add_rms_norm(kept, x, weight, 1e-6)
    assert new_residual.data_ptr() == kept.data_ptr()  # updated in place
    assert_matches(new_residual, expected_residual)
    assert_matches(normed, expected)


def test_rms_norm_of_strided_per_head_views(ops, device):
    """Qwen3's q norm: heads of a view into the fused QKV output."""
    qkv = torch.randn(5, 3 * 64).to(device)
    q = qkv[:, :64].view(5, 2, 32)
    weight = torch.randn(32).to(device)
    assert_matches(ops.rms_norm(q, weight, 1e-6), TORCH_OPS.rms_norm(q, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_rotary_in_place_on_views_into_the_qkv_output(ops, device, dtype, rotary_dim):
    gen = torch.Generator().manual_seed(1)
    tokens, q_heads, kv_heads, head_dim = 6, 4, 2, 32
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    qkv = qkv.to(device)
    q = qkv[:, :q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim:(q_heads + kv_heads) * head_dim].view(tokens, kv_heads,
                                                                        head_dim)
    angles = torch.randn(50, rotary_dim // 2, generator=gen)
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype).to(device)
                for f in (torch.cos, torch.sin))
    positions = torch.tensor([0, 3, 49, 7, 7, 12]).to(device)
    rotary = type("Rotary", (), {"cos": cos, "sin": sin})
    expected_q, expected_k = TORCH_OPS.rotate(q.clone(), k.clone(),
                                              TORCH_OPS.rope_tables(rotary, positions))
    v_before = qkv[:, (q_heads + kv_heads) * head_dim:].clone()
    out_q, out_k = ops.rotate(q, k, ops.rope_tables(rotary, positions))
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert_matches(q, expected_q)
    assert_matches(k, expected_k)
    assert torch.equal(qkv[:, (q_heads + kv_heads) * head_dim:], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(ops, device, dtype):
    gate_up = (3 * torch.randn(9, 2 * 80, generator=torch.Generator().manual_seed(2)))
    gate_up = gate_up.to(dtype).to(device)
    assert_matches(ops.silu_and_mul(gate_up), TORCH_OPS.silu_and_mul(gate_up))


def test_cuda_models_take_the_triton_ops_unless_turned_off(monkeypatch):
    from paged_core.models.elementwise import select_ops

    cuda = torch.device("cuda")  # select_ops only reads the device type
    monkeypatch.delenv("PAGED_CORE_GPU_FUSED_OPS", raising=False)
    assert isinstance(select_ops(cuda, torch.bfloat16), TritonOps)
    monkeypatch.setenv("PAGED_CORE_GPU_FUSED_OPS", "0")
    assert select_ops(cuda, torch.bfloat16) is TORCH_OPS
    monkeypatch.setenv("PAGED_CORE_GPU_FUSED_OPS", "sometimes")
    with pytest.raises(ValueError, match="gpu_fused_ops"):
        select_ops(cuda, torch.float32)
