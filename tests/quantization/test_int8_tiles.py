"""8-bit weights on AMX-INT8 tiles (quantized_int8_tiles.cpp): the levels unwidened, each row of
bfloat16 inputs cut into three 8-bit digits of a 24-bit fixed-point number. Its product is the
dequantized weight's within the digits' rounding (values 2^-15 below a row's largest are
rounded to 2^-22 of it), a row's bits never depend on the rows beside it, and the setting
PAGED_CORE_CPU_INT8_LINEAR picks it or the widening kernels."""
import pytest
import torch
import torch.nn.functional as F

from paged_core.cpu.extension import cpu_extension_available, cpu_ops
from paged_core.cpu.isa import unsupported_reason
from paged_core.quantization.int8_linear import Int8Linear, Int8Weight
from paged_core.quantization.quantized_linear import INT8_LINEAR_SETTING, INT8_TILE_ROWS


def _tile_kernels():
    """The avx512_bf16 kernels where they run AMX-INT8 tiles here, else skip saying why."""
    reason = unsupported_reason("avx512_bf16")
    if reason is not None:
        pytest.skip(reason)
    if not cpu_extension_available("avx512_bf16"):
        pytest.skip("the avx512_bf16 C++ kernels do not build here")
    kernels = cpu_ops("avx512_bf16")
    if not kernels.amx_int8_ready():
        pytest.skip("this CPU (or its OS) gives no AMX-INT8 tiles")
    return kernels


def _int8_layer(out, width, group_size, gen, monkeypatch, kernel="amx_int8"):
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "avx512_bf16")
    monkeypatch.setenv(INT8_LINEAR_SETTING, kernel)
    q = torch.randint(-128, 128, (out, width), generator=gen, dtype=torch.int8)
    weight = Int8Weight(q, torch.rand(out, width // group_size, generator=gen) * 0.01, group_size)
    return weight, Int8Linear(weight, False, torch.bfloat16)


def _digit_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """|error| bound per output: each value off by at most 2^-23 of its row's largest (the
    digits' rounding, taken twice for margin), plus float32 sums' rounding."""
    x, w = x.double(), weight.double().abs()
    return (x.abs().amax(1, keepdim=True) * 2.0 ** -22) * w.sum(1) + 1e-6 * (x.abs() @ w.t())


# groups of 64 and 128, one scale per channel (256 and 1536 features); out 70: a short last
# column group; 1-5 rows: one pass (what the linear sends to the tiles), 6-40 rows: passes of
# up to 5 rows, the last padded with zero digits
@pytest.mark.parametrize("group_size,width,out", [(64, 256, 70), (128, 384, 40),
                                                  (256, 256, 70), (1536, 1536, 96)])
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 17, 40])
def test_tiles_equal_the_dequantized_product_within_the_digits(monkeypatch, group_size, width,
                                                               out, rows):
    kernels = _tile_kernels()
    gen = torch.Generator().manual_seed(rows + group_size)
    weight, layer = _int8_layer(out, width, group_size, gen, monkeypatch)
    assert layer.int8_tile_rows == INT8_TILE_ROWS
    x = torch.randn(rows, width, generator=gen).bfloat16()
    x[0, 5] = 300.0  # an outlier: the row's small values are rounded to 2^-21 of it
    args = (layer.levels, layer.scales, group_size, out)
    product = kernels.int8_tile_gemm(x, *args)
    assert product.dtype is torch.float32
    dequantized = weight.dequantize()
    error = (product.double() - F.linear(x.double(), dequantized.double())).abs()
    assert (error <= _digit_bound(x, dequantized)).all()
    # bfloat16 out: each float32 sum rounded as it is stored, the bits .to gives
    assert torch.equal(kernels.int8_tile_gemm(x, *args, torch.bfloat16), product.bfloat16())
    for row in {0, rows // 2, rows - 1}:  # a row's bits whatever the call's other rows
        assert torch.equal(kernels.int8_tile_gemm(x[row:row + 1], *args), product[row:row + 1])
    layer.dense_rows = rows + 1
    if rows <= INT8_TILE_ROWS:  # the linear's own calls take the tiles
        assert torch.equal(layer.product(x), product)
        assert torch.equal(layer(x), product.bfloat16())
    else:  # more rows widen the levels (column_gemm)
        widened = kernels.column_gemm(x, layer.levels, layer.scales, None, group_size, out,
                                      layer.amx_min_rows)
        assert torch.equal(layer.product(x), widened)


def test_rows_of_zeros_tiny_values_and_nans(monkeypatch):
    """A row of zeros gives zeros, a row of subnormal-range values (2^-130) its own tiny
    product (scaled in two steps), a row holding a NaN only NaNs; the other rows are untouched."""
    kernels = _tile_kernels()
    gen = torch.Generator().manual_seed(3)
    weight, layer = _int8_layer(40, 128, 64, gen, monkeypatch)
    x = torch.randn(4, 128, generator=gen).bfloat16()
    x[1] = 0
    x[2] = (x[2].double() * 2.0 ** -130).bfloat16()
    x[3, 7] = float("nan")
    y = kernels.int8_tile_gemm(x, layer.levels, layer.scales, 64, 40)
    dequantized = weight.dequantize()
    expected = F.linear(x[:3].double(), dequantized.double())
    assert (y[:3].double() - expected).abs().le(_digit_bound(x[:3], dequantized)).all()
    assert torch.equal(y[1], torch.zeros(40)) and y[2].abs().max() > 0
    assert y[3].isnan().all() and y[:3].isfinite().all()


def test_the_setting_picks_the_kernel_and_refuses_what_cannot_run(monkeypatch):
    """bf16 keeps the widening kernels (column_gemm's bits); amx_int8 refuses groups that do
    not fill tile steps of 64, naming the setting; an unknown value is refused by name; auto
    leaves such groups to the widening kernels."""
    kernels = _tile_kernels()
    gen = torch.Generator().manual_seed(4)
    weight, widening = _int8_layer(70, 256, 64, gen, monkeypatch, kernel="bf16")
    assert not widening.int8_tile_rows
    x = torch.randn(3, 256, generator=gen).bfloat16()
    widening.dense_rows = 4
    args = (x, widening.levels, widening.scales, None, 64, 70, widening.amx_min_rows)
    assert torch.equal(widening.product(x), kernels.column_gemm(*args))
    with pytest.raises(ValueError, match=f"{INT8_LINEAR_SETTING}=amx_int8: groups of 32"):
        _int8_layer(40, 128, 32, gen, monkeypatch)
    with pytest.raises(ValueError, match=f"{INT8_LINEAR_SETTING}='tiles'"):
        _int8_layer(40, 128, 64, gen, monkeypatch, kernel="tiles")
    assert not _int8_layer(40, 128, 32, gen, monkeypatch, kernel="auto")[1].int8_tile_rows
    assert _int8_layer(40, 128, 64, gen, monkeypatch, kernel="auto")[1].int8_tile_rows


def test_without_amx_int8_the_setting_is_refused(monkeypatch):
    """Where the tiles cannot run (faked: kernels that say no), amx_int8 is refused by name and
    auto widens; auto widens too where the bfloat16 linears do not take AMX tiles."""
    from paged_core.quantization.quantized_linear import int8_tile_kernel

    class NoInt8Tiles:
        @staticmethod
        def amx_int8_ready() -> bool:
            return False

    class Int8Tiles:
        @staticmethod
        def amx_int8_ready() -> bool:
            return True

    monkeypatch.setenv(INT8_LINEAR_SETTING, "amx_int8")
    with pytest.raises(ValueError, match=f"{INT8_LINEAR_SETTING}=amx_int8: this CPU or OS"):
        int8_tile_kernel(NoInt8Tiles, 64, amx_selected=True)
    monkeypatch.setenv(INT8_LINEAR_SETTING, "auto")
    assert not int8_tile_kernel(NoInt8Tiles, 64, amx_selected=True)
    assert not int8_tile_kernel(Int8Tiles, 64, amx_selected=False)
    assert int8_tile_kernel(Int8Tiles, 1536, amx_selected=True)
    assert not int8_tile_kernel(Int8Tiles, 96, amx_selected=True)
