"""W4A8: 4-bit group-wise weights times rows quantized per token to int8. Every kernel
(``PAGED_CORE_CPU_W4A8``: vnni, amx, float32, and plain torch without the C++ kernels) equals the
formula in float64: each group's integer sums of weight levels times row levels, scaled by the
group's scale, plus the group's offset times the group's sum of row levels, times the row's
scale; the vnni kernel takes any output count, and quantizes rows with the bits of the torch
formula (``per_token_levels``); the amx kernel gives the vnni kernel's bits."""
from types import SimpleNamespace

import pytest
import torch

from paged_core.quantization.int4_linear import Int4Weight
from paged_core.quantization.projections import quantized_linear
from paged_core.quantization.quantized_linear import DENSE_ROWS_SETTING
from paged_core.quantization.w4a8_linear import AMX_FROM_ROWS, W4A8_KERNELS, W4A8_SETTING, \
    W4A8Linear, selected_w4a8_kernel
from paged_core.quantization.w8a8_linear import per_token_levels

from ..w8a8_reference import amx_int8_runs, use_w4a8_kernel


def w4a8_weight(out, width, group_size, gen, zeros=True):
    q = torch.randint(0, 16, (out, width), generator=gen, dtype=torch.uint8)
    scales = torch.rand(out, width // group_size, generator=gen) * 0.02
    zero = torch.randn(out, width // group_size, generator=gen) * 0.01 if zeros else \
        torch.zeros(out, width // group_size)
    return Int4Weight(q, scales, zero, group_size, activations_int8=True)


def expected_product(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """The module doc's formula in float64 (from the rows' float32 values)."""
    levels, scale = per_token_levels(x.float())
    out, width = weight.q.shape
    g = weight.group_size
    rows = levels.double().view(len(x), width // g, g)
    q = weight.q.double().view(out, width // g, g)
    sums = torch.einsum("mgk,ogk->mog", rows, q)  # exact: integers below 2^53
    offsets = weight.zeros.double() - 8 * weight.scales.double()
    y = (sums * weight.scales.double()).sum(-1) + rows.sum(-1) @ offsets.T
    return y * scale.double()


@pytest.mark.parametrize("kernel", ["auto", *W4A8_KERNELS])
@pytest.mark.parametrize("rows", [1, 4, 5, 8, 9, 17, 40])
@pytest.mark.parametrize("zeros", [False, True])
def test_w4a8_is_the_grouped_integer_product_of_per_token_levels(cpu_isa, monkeypatch, kernel,
                                                                  rows, zeros):
    """On every CPU level: float32 rows (a zero row among them: scale 1, levels 0), 96 outputs,
    groups of 32 (amx: 64, whole tile steps); the float32 kernels' dense path from 24 rows."""
    use_w4a8_kernel(monkeypatch, kernel, cpu_isa)
    monkeypatch.setenv(DENSE_ROWS_SETTING, "24")
    gen = torch.Generator().manual_seed(rows)
    weight = w4a8_weight(96, 128, 64 if kernel == "amx" else 32, gen, zeros)
    x = torch.randn(rows, 128, generator=gen)
    x[rows // 2] = 0
    layer = quantized_linear([weight], False, torch.float32)
    assert type(layer) is W4A8Linear and kernel in ("auto", layer.kernel)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    torch.testing.assert_close(y.double(), expected_product(x, weight), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("rows,features,outputs,group_size", [
    (1, 16, 1, 16), (3, 64, 33, 16), (8, 256, 70, 128), (11, 96, 17, 32), (20, 576, 960, 64)])
def test_the_vnni_kernel_takes_any_output_count(cpu_isa, monkeypatch, rows, features, outputs,
                                                group_size, zeros):
    """``w4a8_product`` on ``w4a8_pack``'s column groups of 32 outputs where the outputs are no
    multiple of 32 (the padding adds nothing and is never stored), bfloat16 rows as they are:
    the formula's value, the levels quantized with ``per_token_levels``' bits; stored as
    bfloat16, the float32 result's ``.to`` bits. A symmetric weight (no zero points: every
    offset is -8 scale) keeps each group's scales alone, its sums starting at -8 times the
    group's sum of row levels."""
    use_w4a8_kernel(monkeypatch, "vnni", cpu_isa)
    gen = torch.Generator().manual_seed(features + outputs)
    weight = w4a8_weight(outputs, features, group_size, gen, zeros)
    layer = W4A8Linear(weight, False, torch.bfloat16)
    columns = (outputs + 31) // 32
    assert layer.w4a8_outputs == outputs and layer.levels.shape == (columns, features // 4, 64)
    assert layer.scales.shape == (columns, features // group_size, 2 if zeros else 1, 32)
    x = torch.randn(rows, features, generator=gen).bfloat16()
    y = layer.product(x)
    assert y.dtype == torch.float32 and y.shape == (rows, outputs)
    torch.testing.assert_close(y.double(), expected_product(x, weight), atol=1e-5, rtol=1e-5)
    rounded = layer.product(x, out_dtype=torch.bfloat16)  # as it is stored: .to's bits
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, y.bfloat16())


@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("rows,features,outputs,group_size", [
    (1, 64, 1, 64), (8, 576, 70, 64), (16, 128, 33, 128), (31, 256, 96, 64), (32, 576, 64, 64),
    (33, 192, 40, 64), (70, 1536, 100, 64), (96, 256, 32, 256)])
def test_the_amx_kernel_gives_the_vnni_kernels_bits(cpu_isa, monkeypatch, rows, features,
                                                    outputs, group_size, zeros):
    """``w4a8_product`` on AMX-INT8 tiles (``amx_min_rows``) against vpdpbusd, on the same
    packed levels: the same bits, float32 and bfloat16, float32 and float16 factors, at 1-96
    rows (blocks of 32 with a short last one, padded with zero rows), groups of 1-4 tile steps,
    outputs no multiple of 32, symmetric weights and ones with zero points."""
    use_w4a8_kernel(monkeypatch, "amx", cpu_isa)
    from paged_core.cpu.extension import cpu_ops

    ops = cpu_ops(cpu_isa)
    gen = torch.Generator().manual_seed(rows + features)
    weight = w4a8_weight(outputs, features, group_size, gen, zeros)
    offsets = weight.zeros - 8 * weight.scales
    levels, factors = ops.w4a8_pack(weight.q, weight.scales, offsets, group_size)
    x = torch.randn(rows, features, generator=gen).bfloat16()
    x[rows // 2] = 0
    for stored in (factors, factors.half()):
        for out in (None, torch.bfloat16):
            vnni = ops.w4a8_product(x, levels, stored, group_size, outputs, out, 0)
            tiles = ops.w4a8_product(x, levels, stored, group_size, outputs, out, 1)
            assert torch.equal(tiles, vnni), (stored.dtype, out)
    tiles = ops.w4a8_product(x, levels, factors, group_size, outputs, None, 1)
    torch.testing.assert_close(tiles.double(), expected_product(x, weight), atol=1e-5, rtol=1e-5)


def test_exact_float16_factors_are_kept_in_float16_with_the_same_bits(cpu_isa, monkeypatch):
    """Symmetric scales that float16 holds exactly (a checkpoint's bf16 or fp16 scales; their
    offsets are -8 scale) are kept as float16 (half the factor bytes a step reads); the kernel
    widens them to the same float32 values, so the products are the float32 factors' bits.
    Zero points whose offsets float16 cannot hold, and other scales, stay float32."""
    use_w4a8_kernel(monkeypatch, "vnni", cpu_isa)
    from paged_core.cpu.extension import cpu_ops

    gen = torch.Generator().manual_seed(11)
    weight = w4a8_weight(70, 128, 32, gen, zeros=False)
    weight.scales = weight.scales.half().float()
    layer = W4A8Linear(weight, False, torch.bfloat16)
    assert layer.scales.dtype == torch.float16
    offsets = weight.zeros - 8 * weight.scales
    levels, float32_factors = cpu_ops(cpu_isa).w4a8_pack(weight.q, weight.scales, offsets, 32)
    assert float32_factors.dtype == torch.float32
    assert torch.equal(layer.scales.float(), float32_factors)
    x = torch.randn(9, 128, generator=gen).bfloat16()
    expected = cpu_ops(cpu_isa).w4a8_product(x, levels, float32_factors, 32, 70)
    assert torch.equal(layer.product(x), expected)
    zeros = w4a8_weight(70, 128, 32, gen).zeros.half().float()
    asymmetric = Int4Weight(weight.q, weight.scales, zeros, 32, activations_int8=True)
    assert W4A8Linear(asymmetric, False, torch.bfloat16).scales.dtype == torch.float32
    weight.scales = weight.scales + 1e-9  # no longer float16 values
    assert W4A8Linear(weight, False, torch.bfloat16).scales.dtype == torch.float32


def test_the_bfloat16_model_takes_bfloat16_rows_on_every_kernel(monkeypatch):
    """``forward`` returns the input's dtype; both kernels agree to bfloat16's rounding."""
    gen = torch.Generator().manual_seed(7)
    weight = w4a8_weight(64, 192, 64, gen)
    x = torch.randn(2, 3, 192, generator=gen).bfloat16()
    outputs = {}
    for kernel in W4A8_KERNELS:
        if kernel == "amx" and not amx_int8_runs(None):
            continue  # the tiles' own tests skip, saying why
        use_w4a8_kernel(monkeypatch, kernel)
        outputs[kernel] = W4A8Linear(weight, False, torch.bfloat16)(x)
        assert outputs[kernel].dtype == torch.bfloat16 and outputs[kernel].shape == (2, 3, 64)
    expected = expected_product(x.view(-1, 192), weight).view(2, 3, 64)
    for y in outputs.values():
        torch.testing.assert_close(y.double(), expected, atol=2e-2, rtol=1e-2)


def test_without_the_cpp_kernels_the_torch_formula_runs(monkeypatch):
    import paged_core.quantization.quantized_linear as quantized_linear_module

    monkeypatch.setattr(quantized_linear_module, "cpu_extension_available", lambda level: False)
    gen = torch.Generator().manual_seed(3)
    weight = w4a8_weight(40, 64, 32, gen)
    layer = W4A8Linear(weight, False, torch.float32)
    assert layer.kernels is None and layer.kernel == "float32"
    x = torch.randn(3, 64, generator=gen)
    torch.testing.assert_close(layer(x).double(), expected_product(x, weight), atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("setting,vnni_ready,amx_ready,amx_selected,group_size,chosen", [
    ("", True, False, True, 64, ("vnni", 0)),
    ("", True, True, True, 64, ("vnni", AMX_FROM_ROWS)),
    ("auto", True, True, True, 32, ("vnni", 0)),
    ("auto", True, True, False, 64, ("vnni", 0)),
    ("auto", False, False, True, 64, ("float32", 0)),
    (" VNNI ", True, True, True, 64, ("vnni", 0)),
    (" AMX ", True, True, False, 128, ("amx", 1)),
    ("float32", True, True, True, 64, ("float32", 0))])
def test_the_w4a8_setting_picks_a_kernel(monkeypatch, setting, vnni_ready, amx_ready,
                                         amx_selected, group_size, chosen):
    """``PAGED_CORE_CPU_W4A8``: ``auto`` takes paged-core's vnni kernel where it runs, its calls
    from ``AMX_FROM_ROWS`` rows on AMX-INT8 tiles where those run, the groups are whole tile
    steps and the bfloat16 linears take AMX, else the float32 kernels; a kernel named takes
    every call."""
    monkeypatch.setenv(W4A8_SETTING, setting)
    kernels = SimpleNamespace(int8_vnni_ready=lambda: vnni_ready)
    if amx_ready:  # the op exists in the avx512_bf16 build alone
        kernels.amx_int8_ready = lambda: True
    assert selected_w4a8_kernel(kernels, group_size, amx_selected) == chosen
    if not vnni_ready:
        assert selected_w4a8_kernel(None, group_size, amx_selected) == chosen  # no C++ kernels


@pytest.mark.parametrize("setting,amx_ready,group_size,message", [
    ("onednn", False, 64, "'onednn' is not a W4A8 kernel"),
    ("vnni", False, 64, "vnni needs paged-core's AVX-512"),
    ("amx", False, 64, "amx needs paged-core's avx512_bf16 kernels"),
    ("amx", True, 32, "amx needs groups of a multiple of 64 features, got 32")])
def test_w4a8_kernels_that_cannot_be_taken_are_refused_naming_the_setting(monkeypatch, setting,
                                                                           amx_ready, group_size,
                                                                           message):
    """A kernel name it does not know, one this CPU cannot run, or tiles for groups that are
    no whole tile steps."""
    monkeypatch.setenv(W4A8_SETTING, setting)
    kernels = SimpleNamespace(int8_vnni_ready=lambda: setting == "amx")
    if amx_ready:
        kernels.amx_int8_ready = lambda: True
    with pytest.raises(ValueError, match=f"{W4A8_SETTING}={message}"):
        selected_w4a8_kernel(kernels, group_size)
