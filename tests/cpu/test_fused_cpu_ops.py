"""The fused C++ elementwise ops give the plain-torch ops' numbers: bit for bit where no
float32 sum is involved (rotary, the residual add), within one rounding step of RMSNorm's
sum of squares otherwise, on every CPU path (``cpu_isa`` fixture); and CPU engines use them."""
import pytest
import torch

from paged_core.models.elementwise import TORCH_OPS, FusedCpuOps, select_ops

DTYPES = [torch.float32, torch.bfloat16]


def _close_to_one_rounding(actual, expected):
    """Equal, or off by at most one unit of the dtype's precision (a rounding flipped)."""
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=1e-6)
        return
    diff = (actual.float() - expected.float()).abs()
    ulp = expected.float().abs().clamp_min(1e-30) * 2 ** -7
    assert bool((diff <= ulp).all()), diff.max()
    assert (diff == 0).float().mean() > 0.99  # flips are rare


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 37])
def test_rms_norm_and_add_rms_norm(rows, dtype, cpu_isa):
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    fused = FusedCpuOps(cpu_isa)
    _close_to_one_rounding(fused.rms_norm(x, weight, 1e-5), TORCH_OPS.rms_norm(x, weight, 1e-5))

    residual = torch.randn(rows, 576, generator=gen).to(dtype)
    expected_residual, expected = TORCH_OPS.add_rms_norm(residual, x, weight, 1e-5)
    mine = residual.clone()
    new_residual, normed = fused.add_rms_norm(mine, x, weight, 1e-5)
    assert new_residual is mine  # updated in place
    assert torch.equal(new_residual, expected_residual)
    _close_to_one_rounding(normed, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_a_strided_per_head_view(dtype, cpu_isa):
    """Qwen3's q/k norm runs over head_dim on a view of the fused qkv output."""
    qkv = torch.randn(6, 3 * 4 * 32).to(dtype)
    q = qkv[:, :128].view(6, 4, 32)
    weight = torch.rand(32).to(dtype)
    out = FusedCpuOps(cpu_isa).rms_norm(q, weight, 1e-6)
    assert out.shape == q.shape
    _close_to_one_rounding(out, TORCH_OPS.rms_norm(q, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [64, 48])  # 48: partial rotary, the rest passes through
def test_rotary_embedding_is_bit_identical_in_place(dtype, rotary_dim, cpu_isa):
    gen = torch.Generator().manual_seed(0)
    tokens, q_heads, kv_heads, dim = 9, 6, 2, 64

    class Tables:
        cos = torch.randn(100, rotary_dim, generator=gen).to(dtype)
        sin = torch.randn(100, rotary_dim, generator=gen).to(dtype)

    positions = torch.tensor([0, 5, 99, 3, 3, 17, 40, 41, 42])
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    q = qkv[:, :q_heads * dim].view(tokens, q_heads, dim)  # strided views, as in the model
    k = qkv[:, q_heads * dim:(q_heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v_before = qkv[:, (q_heads + kv_heads) * dim:].clone()
    expected_q, expected_k = TORCH_OPS.rotate(q, k, TORCH_OPS.rope_tables(Tables, positions))
    assert torch.equal(expected_q[..., rotary_dim:], q[..., rotary_dim:])  # not rotated
    fused = FusedCpuOps(cpu_isa)
    out_q, out_k = fused.rotate(q, k, fused.rope_tables(Tables, positions))
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert torch.equal(out_q, expected_q) and torch.equal(out_k, expected_k)
    assert torch.equal(qkv[:, (q_heads + kv_heads) * dim:], v_before)  # v untouched


@pytest.mark.parametrize("rotary_dim", [64, 32, 16])  # whole heads, then partial rotary
def test_rotary_embedding_keeps_torchs_bits_for_special_values_and_long_prompts(rotary_dim,
                                                                                cpu_isa):
    """bfloat16 rows give torch's bits for zeros of either sign, infinities and NaN (as
    torch's 0x7FC0), and across the threads' shares of a prompt of thousands of tokens."""
    gen = torch.Generator().manual_seed(3)
    tokens, q_heads, kv_heads, dim = 3000, 3, 1, 64
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e38, -3e-39])

    class Tables:
        cos = torch.randn(4096, rotary_dim, generator=gen).bfloat16()
        sin = torch.randn(4096, rotary_dim, generator=gen).bfloat16()

    Tables.cos[7, :7] = special
    Tables.sin[7, -7:] = special
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    positions[:2] = 7
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, generator=gen).bfloat16()
    qkv[0, :7] = special
    qkv[1, rotary_dim // 2:rotary_dim // 2 + 7] = special
    q = qkv[:, :q_heads * dim].view(tokens, q_heads, dim)
    k = qkv[:, q_heads * dim:(q_heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    expected_q, expected_k = TORCH_OPS.rotate(q.clone(), k.clone(),
                                              TORCH_OPS.rope_tables(Tables, positions))
    fused = FusedCpuOps(cpu_isa)
    out_q, out_k = fused.rotate(q, k, fused.rope_tables(Tables, positions))
    bits = lambda t: t.contiguous().view(torch.int16)  # noqa: E731 (NaN == NaN as bits)
    expected_nan = torch.tensor(0x7FC0, dtype=torch.int16)
    for out, expected in ((out_q, expected_q), (out_k, expected_k)):
        want = torch.where(expected.isnan(), expected_nan, bits(expected))
        assert torch.equal(bits(out), want)
    assert out_q.isnan().any() and out_q.isinf().any()  # the special values reached the output


def test_bad_inputs_raise(cpu_isa):
    tables = torch.zeros(4, 8), torch.zeros(4, 8)
    q, k = torch.zeros(2, 1, 8), torch.zeros(2, 1, 8)
    with pytest.raises(RuntimeError, match="outside the 4-row rotary tables"):
        FusedCpuOps(cpu_isa).rotate(q, k, (torch.tensor([0, 4]), *tables))
    with pytest.raises(RuntimeError, match="share x's dtype"):
        FusedCpuOps(cpu_isa).rms_norm(torch.zeros(2, 8), torch.zeros(8, dtype=torch.bfloat16), 1e-6)


def test_cpu_engines_use_the_fused_ops_of_the_selected_path(cpu_isa):
    for dtype in (torch.float32, torch.bfloat16):
        ops = select_ops(torch.device("cpu"), dtype)
        assert isinstance(ops, FusedCpuOps) and ops.cpu_isa == cpu_isa
    assert select_ops(torch.device("cpu"), torch.float16) is TORCH_OPS
    assert select_ops(torch.device("cuda"), torch.bfloat16).name == "triton"  # CUDA: fused Triton
    from paged_core import LLM
    model = LLM(dtype="float32", num_kv_blocks=8).engine.core.executor.runner.model
    ops = model.ops
    assert isinstance(ops, FusedCpuOps) and ops.cpu_isa == cpu_isa
    assert model.layers[0].input_layernorm.ops is ops
    assert model.layers[0].self_attn.ops is ops and model.layers[0].mlp.ops is ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 9])
def test_silu_and_mul(rows, dtype, cpu_isa):
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 1539, generator=gen) * 6).to(dtype)  # not a multiple of 8
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])  # exp overflow territory, zeros
    out = FusedCpuOps(cpu_isa).silu_and_mul(gate_up)
    assert out.shape == (rows, 1539) and torch.isfinite(out).all()
    _close_to_one_rounding(out, TORCH_OPS.silu_and_mul(gate_up))


@pytest.mark.parametrize("width", [1539, 1547])  # 16-lane blocks, then 3 / 8 + 3 left over
def test_silu_and_mul_gives_the_avx2_bits_on_the_avx512_levels(width, cpu_isa):
    """The avx512 levels' 16-lane exp and silu are lane for lane the AVX2 ones."""
    if cpu_isa not in ("avx512", "avx512_bf16"):
        pytest.skip(f"the 16-lane silu is the avx512 levels'; this run is {cpu_isa}")
    gen = torch.Generator().manual_seed(width)
    gate_up = (torch.randn(5, 2 * width, generator=gen) * 6).bfloat16()
    gate_up[0, :5] = torch.tensor([-100.0, 100.0, 0.0, -0.0, -87.5])  # clamped exp, zeros
    assert torch.equal(FusedCpuOps(cpu_isa).silu_and_mul(gate_up),
                       FusedCpuOps("avx2").silu_and_mul(gate_up))
