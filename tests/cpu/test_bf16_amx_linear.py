"""``Bf16DotLinear`` on AMX tiles (``PAGED_CORE_CPU_LINEAR=amx``): calls of ``amx_min_rows``
rows or more give the exact product rounded once, every row's bits independent of the other
rows of such calls, smaller calls and in_features that are not a multiple of 32 the
``vdpbf16ps`` loop's bits; SiLU-and-mul fused on the tiles gives the two ops' bits; the
setting's checks. The kernel tests run only on CPUs with
AMX-BF16; the refusal of ``amx`` elsewhere runs everywhere."""
import pytest
import torch

from paged_core.cpu import isa
from paged_core.cpu.isa import unsupported_reason

NO_NATIVE_BF16 = unsupported_reason("avx512_bf16")
NO_AMX = NO_NATIVE_BF16 or (None if isa.has_amx_bf16() else "this CPU lacks amx_bf16")
needs_amx = pytest.mark.skipif(NO_AMX is not None, reason=str(NO_AMX))


def _layer(out_features: int, in_features: int, with_bias: bool, amx_min_rows: int):
    from paged_core.models.bf16_dot_linear import Bf16DotLinear

    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    return Bf16DotLinear(weight, bias, amx_min_rows), weight, bias


def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The unfused op: silu_and_mul of the avx512_bf16 level on a product."""
    from paged_core.models.elementwise import FusedCpuOps

    return FusedCpuOps("avx512_bf16").silu_and_mul(gate_up)


def _rows(count: int, in_features: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(count, in_features, generator=torch.Generator().manual_seed(seed)).bfloat16()


@needs_amx
@pytest.mark.parametrize("rows", [16, 17, 31, 32, 33, 300])
@pytest.mark.parametrize("out_features", [16, 50, 96, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_amx_calls_give_the_exact_product_rounded_once(rows, out_features, with_bias):
    layer, weight, bias = _layer(out_features, 128, with_bias, amx_min_rows=16)
    x = _rows(rows, 128)
    y = layer(x)
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    assert y.shape == (rows, out_features) and y.dtype == torch.bfloat16
    # float32 sums of 128 exact products, then one rounding to bfloat16 (half an ulp: 2^-9)
    magnitude = x.double().abs() @ weight.double().abs().T + 1
    assert ((y.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + magnitude * 128 * 2.0 ** -23).all()


@needs_amx
def test_weights_longer_than_one_l2_chunk_give_the_exact_product():
    # 4096 in_features: a column group's weights are 256 KiB, so a chunk of the groups kept in
    # L2 (bf16_amx_linear.cpp's groups_in_l2) holds two: 10 groups cross five chunk edges
    layer, weight, bias = _layer(300, 4096, True, amx_min_rows=16)
    x = _rows(70, 4096) / 8
    y = layer(x)
    exact = x.double() @ weight.double().T + bias.double()
    magnitude = x.double().abs() @ weight.double().abs().T + 1
    assert ((y.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + magnitude * 4096 * 2.0 ** -23).all()
    assert torch.equal(layer(x[33:60]), y[33:60])


@needs_amx
def test_a_row_gives_the_same_bits_in_any_amx_sized_call():
    """Whatever the call's size, and however many rows its last block holds (the tiles of a
    short block are configured for its rows only: 1-16 on one A tile, 17-31 on two)."""
    layer = _layer(200, 256, True, amx_min_rows=1)[0]
    batch = _rows(600, 256, seed=2)
    full = layer(batch)
    # the tiles ran: tdpbf16ps rounds some of 120000 sums differently from vdpbf16ps
    assert not torch.equal(full, _layer(200, 256, True, amx_min_rows=0)[0](batch))
    for rows in (1, 8, 15, 16, 17, 31, 40, 48, 49, 256, 257, 513):
        assert torch.equal(layer(batch[:rows]), full[:rows]), rows
    assert torch.equal(layer(batch[280:300]), full[280:300])  # from the second block of 256


@needs_amx
def test_small_calls_and_in_features_off_the_tiles_take_the_dot_loop():
    for in_features, rows in ((128, 15), (128, 1), (80, 64), (130, 40)):
        amx = _layer(64, in_features, True, amx_min_rows=16)[0]
        dot = _layer(64, in_features, True, amx_min_rows=0)[0]
        x = _rows(rows, in_features)
        assert torch.equal(amx(x), dot(x)), (in_features, rows)


@needs_amx
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 32, 33, 300])
@pytest.mark.parametrize("width", [32, 96, 48])  # 48: not whole 32-column groups
@pytest.mark.parametrize("with_bias", [False, True])
def test_silu_and_mul_on_amx_tiles_gives_the_two_ops_bits(rows, width, with_bias):
    """The fused op on the tiles (units of gate group u and up group u + I / 32) equals the
    AMX linear followed by silu_and_mul, bit for bit, with any leading shape."""
    layer = _layer(2 * width, 128, with_bias, amx_min_rows=1)[0]
    scale = torch.logspace(-2, 2, rows).unsqueeze(1)  # SiLU's negative tail to inf * 0
    x = (_rows(rows, 128, seed=5).float() * scale).bfloat16()
    if rows > 1:
        x[-1, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e30])
    expected = _silu_and_mul(layer(x))
    fused = layer.silu_and_mul(x)
    assert fused.shape == (rows, width)
    assert torch.equal(fused.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(layer.silu_and_mul(x.view(1, rows, 128)).view(torch.int16),
                       fused.view(1, rows, width).view(torch.int16))


@needs_amx
@pytest.mark.parametrize("threads", [1, 3])
def test_silu_and_mul_on_amx_tiles_across_l2_chunks_and_threads(threads, torch_threads):
    # 4096 in_features: a chunk of gate_up units kept in L2 holds one (two groups of 256 KiB)
    layer = _layer(2 * 160, 4096, True, amx_min_rows=1)[0]
    x = _rows(70, 4096, seed=3) / 8
    dot = _layer(2 * 160, 4096, True, amx_min_rows=0)[0]
    assert not torch.equal(layer.silu_and_mul(x), dot.silu_and_mul(x))
    expected = _silu_and_mul(layer(x))
    torch_threads(threads)
    assert torch.equal(layer.silu_and_mul(x).view(torch.int16), expected.view(torch.int16))


@needs_amx
def test_auto_takes_amx_on_amx_cpus(monkeypatch):
    from paged_core.models.bf16_dot_linear import Bf16DotLinear
    from paged_core.models.cpu_linear import AMX_MIN_ROWS, packed_linear

    weight = torch.randn(64, 128).bfloat16()
    monkeypatch.delenv("PAGED_CORE_CPU_LINEAR", raising=False)
    layer = packed_linear(weight, None, torch.bfloat16)
    assert type(layer) is Bf16DotLinear and layer.amx_min_rows == AMX_MIN_ROWS
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "bf16_dot")
    assert packed_linear(weight, None, torch.bfloat16).amx_min_rows == 0


def test_amx_is_refused_on_cpus_without_it(monkeypatch):
    monkeypatch.setattr(isa, "has_amx_bf16", lambda: False)
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "amx")
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_LINEAR=amx: this CPU lacks amx_bf16"):
        isa.selected_bf16_linear()
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "auto")
    assert isa.selected_bf16_linear() == "bf16_dot"


def test_without_the_os_granting_tiles_auto_keeps_the_dot_loop_and_amx_is_refused(
        amx_cpu_without_tile_state, monkeypatch):
    from paged_core.models.cpu_linear import bf16_amx_min_rows

    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "auto")
    assert bf16_amx_min_rows() == 0
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "amx")
    with pytest.raises(RuntimeError, match="PAGED_CORE_CPU_LINEAR=amx: the OS did not grant"):
        bf16_amx_min_rows()
