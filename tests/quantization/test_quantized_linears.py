"""The weight-only quantized linears: the C++ kernels of every CPU level this machine runs,
the many-rows dense path and the plain-torch path all equal the product with the
dequantized weight; W8A8 equals its integer arithmetic done in float64.

Kinds of weight: ``int4``; ``int8`` (levels over the whole range); ``int8-narrow`` (levels
within -64..63, as GGUF Q6_K: the column layout keeps them biased, 7-bit style, and
``int8-narrow-zeros`` with zeros); ``int8-five`` (levels -16..15, as GGUF Q5_0: the column
layout keeps them in 5 bits) and ``int8-zeros`` (levels 0..31 and a zero per group, as GGUF
Q5_1 and Q5_K: 5 bits too); ``int8-wide-zeros``
(the whole range and zeros: GPTQ or compressed-tensors asymmetric 8-bit); ``int8-iq4`` (levels
that are all llama.cpp's IQ4_NL values, as GGUF IQ4_NL and IQ4_XS: the column layout keeps
their 4-bit indices)."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from paged_core.quantization.int4_linear import Int4Linear, Int4Weight, pack_nibbles, \
    unpack_nibbles
from paged_core.quantization.int8_linear import IQ4_NL_VALUES, Int8Linear, Int8Weight
from paged_core.quantization.projections import ConcatLinear, quantized_linear
from paged_core.quantization.quantized_linear import DENSE_ROWS_SETTING
from paged_core.quantization.w8a8_linear import AMX_FROM_ROWS, ONEDNN_FROM_ROWS, W8A8_KERNELS, \
    W8A8_SETTING, W8A8Linear, per_token_levels, selected_w8a8_kernel

from ..w8a8_reference import use_w8a8_kernel


def int4_weight(out, width, group_size, gen):
    q = torch.randint(0, 16, (out, width), generator=gen, dtype=torch.uint8)
    scales = torch.rand(out, width // group_size, generator=gen) * 0.02
    zeros = torch.randn(out, width // group_size, generator=gen) * 0.01
    return Int4Weight(q, scales, zeros, group_size)


def int8_weight(out, width, group_size, gen, low=-128, high=128, zeros=False):
    q = torch.randint(low, high, (out, width), generator=gen, dtype=torch.int8)
    scales = torch.rand(out, width // group_size, generator=gen) * 0.01
    zero = -torch.rand(out, width // group_size, generator=gen) * 0.3 if zeros else None
    return Int8Weight(q, scales, group_size, zeros=zero)


def iq4_weight(out, width, group_size, gen):
    index = torch.randint(0, 16, (out, width), generator=gen)
    q = torch.tensor(IQ4_NL_VALUES, dtype=torch.int8)[index]
    return Int8Weight(q, torch.rand(out, width // group_size, generator=gen) * 0.001, group_size)


WEIGHTS = {"int4": int4_weight, "int8": int8_weight, "int8-iq4": iq4_weight,
           "int8-narrow": lambda *args: int8_weight(*args, low=-64, high=64),
           "int8-narrow-zeros": lambda *args: int8_weight(*args, low=-64, high=64, zeros=True),
           "int8-five": lambda *args: int8_weight(*args, low=-16, high=16),
           "int8-zeros": lambda *args: int8_weight(*args, low=0, high=32, zeros=True),
           "int8-wide-zeros": lambda *args: int8_weight(*args, zeros=True)}
LINEARS = {kind: Int4Linear if kind == "int4" else Int8Linear for kind in WEIGHTS}


def weight_and_linear(kind):
    """The maker of a random weight of ``kind`` (``out, width, group_size, gen``) and its linear."""
    return WEIGHTS[kind], LINEARS[kind]


def vdpbf16ps_column_linear(cpu_isa, kind, group_size, gen, path):
    """A random ``[70, 256]`` weight of ``kind`` and its bfloat16 linear in the column layout,
    whose ``path`` (its column kernel or dense path) runs on vdpbf16ps; skips where it does
    not (below the avx512_bf16 level, or on AMX tiles)."""
    make, linear = weight_and_linear(kind)
    weight = make(70, 256, group_size, gen)
    layer = linear(weight, False, torch.bfloat16)
    if not layer.column_outputs or layer.amx_min_rows:
        pytest.skip(f"the vdpbf16ps {path} is the avx512_bf16 level's without AMX; this run is "
                    f"{cpu_isa}{' with AMX tiles' if layer.amx_min_rows else ''}")
    return weight, layer


def test_nibbles_pack_and_unpack_exactly():
    q = torch.randint(0, 16, (6, 128), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    packed = pack_nibbles(q, 32)
    assert packed.shape == (6, 64) and torch.equal(unpack_nibbles(packed, 32), q)
    assert packed[0, 0] == q[0, 0] | (q[0, 16] << 4)  # feature j and j + 16 of group 0


# out 40: not a multiple of the threads' row split; groups of 16 (GGUF Q6_K), 32, 64, one per
# channel; rows below and past the dense threshold; float32 and bfloat16 inputs
@pytest.mark.parametrize("kind,group_size", [("int4", 32), ("int4", 64), ("int4", 16),
                                             ("int8", 16), ("int8", 32), ("int8", 128),
                                             ("int8-narrow", 16), ("int8-zeros", 32),
                                             ("int8-zeros", 128), ("int8-wide-zeros", 32),
                                             ("int8-iq4", 32), ("int8-five", 32),
                                             ("int8-narrow-zeros", 32)])
@pytest.mark.parametrize("rows", [1, 3, 5, 9])
def test_kernels_equal_the_dequantized_product(cpu_isa, monkeypatch, kind, group_size, rows):
    gen = torch.Generator().manual_seed(rows)
    make, linear = weight_and_linear(kind)
    weight = make(40, 128, group_size, gen)
    x = torch.randn(rows, 128, generator=gen)
    expected = F.linear(x, weight.dequantize())
    layer = linear(weight, False, torch.float32)
    assert layer.kernels is not None  # the C++ kernels of this level
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-4)
    monkeypatch.setenv(DENSE_ROWS_SETTING, str(rows))  # the many-rows path, same rows
    dense = linear(weight, False, torch.float32)
    assert torch.equal(dense.dequantized_weight(), weight.dequantize())
    torch.testing.assert_close(dense(x), expected, atol=1e-5, rtol=1e-5)
    bf16 = linear(weight, False, torch.bfloat16)
    out = bf16(x.bfloat16())
    assert out.dtype is torch.bfloat16
    expected = F.linear(x.bfloat16().float(), weight.dequantize())
    assert (out.float() - expected).abs().max() <= 1e-2 * expected.abs().max()  # bf16 rounding


# out 40 and 70: column groups of 32 with a short last one; 1-13 rows: every row tile; 40
# rows: two passes of the AMX kernel for 4 bits, the second short, and one pass on three row
# tiles for 8 bits, the third zero-padded; 48: three full row tiles; 75: a pass of 32 rows,
# then 43; int8 groups of 256: one scale per output channel
@pytest.mark.parametrize("kind,group_size,out", [("int4", 16, 40), ("int4", 32, 70),
                                                 ("int4", 128, 40), ("int8", 32, 40),
                                                 ("int8", 256, 70), ("int8-narrow", 16, 40),
                                                 ("int8-narrow", 32, 70), ("int8-zeros", 32, 40),
                                                 ("int8-zeros", 64, 70),
                                                 ("int8-wide-zeros", 64, 40), ("int8-iq4", 32, 70),
                                                 ("int8-iq4", 64, 40), ("int8-five", 32, 70),
                                                 ("int8-five", 16, 40), ("int8-narrow-zeros", 32, 40)])
@pytest.mark.parametrize("rows", [1, 2, 7, 13, 40, 48, 75])
def test_bf16_column_kernels_equal_the_dequantized_product(cpu_isa, kind, group_size, out, rows):
    """At the avx512_bf16 level a bfloat16 Int4Linear / Int8Linear keeps column_pack's layout:
    its float32 product of bfloat16 rows is the dequantized weight's (float32 sums: near
    exact, by vdpbf16ps and, on a CPU with AMX, by the tiles), its dequantized weight is exactly the levels', and its many-rows path (rows past
    AMX_MIN_ROWS included) multiplies by that weight in bfloat16; below that level the row
    kernels keep the row layout, and W8A8 keeps it everywhere."""
    gen = torch.Generator().manual_seed(rows + group_size)
    make, linear = weight_and_linear(kind)
    weight = make(out, 256, group_size, gen)
    layer = linear(weight, False, torch.bfloat16)
    assert bool(layer.column_outputs) == (cpu_isa == "avx512_bf16")
    if not layer.column_outputs:
        pytest.skip(f"the column layout is the avx512_bf16 level's; this run is {cpu_isa}")
    per_channel = int8_weight(out, 256, 256, gen)
    per_channel.activations_int8 = True
    assert W8A8Linear(per_channel, False, torch.bfloat16).column_outputs == 0
    pair_bytes = {"int4": 32, "int8-iq4": 32, "int8-five": 40, "int8-zeros": 40}.get(kind, 64)
    assert layer.levels.shape == ((out + 31) // 32, 128, pair_bytes)
    assert (layer.levels.dtype is torch.uint8) == (kind in ("int4", "int8-narrow", "int8-narrow-zeros",
                                                            "int8-five"))
    assert torch.equal(layer.dequantized_weight(), weight.dequantize())
    x = torch.randn(rows, 256, generator=gen).bfloat16()
    # below the dense threshold (set here; by default 40 rows for 4 bits, 36 for 8) every call
    # takes the column kernels' float32 sums
    layer.dense_rows = rows + 1
    product = layer.product(x)
    assert product.dtype is torch.float32
    expected = F.linear(x.double(), weight.dequantize().double())
    torch.testing.assert_close(product.double(), expected, atol=1e-5, rtol=1e-5)
    # both kernels, whichever the rows took: vdpbf16ps, and AMX tiles where the CPU has them
    for amx_min_rows in (0, 1):
        args = (x, layer.levels, layer.scales, layer.offsets, group_size, out, amx_min_rows)
        both = layer.kernels.column_gemm(*args)
        torch.testing.assert_close(both.double(), expected, atol=1e-5, rtol=1e-5)
        # bfloat16 out: each float32 sum rounded as it is stored, the bits .to gives
        rounded = layer.kernels.column_gemm(*args, torch.bfloat16)
        assert rounded.dtype is torch.bfloat16 and torch.equal(rounded, both.bfloat16())
    assert torch.equal(layer(x), product.bfloat16())  # forward asks the kernel for bfloat16
    # a row's sums depend on it alone: the last row in any call taking the same kernel (8-bit
    # calls of up to layer.int8_tile_rows rows on AMX-INT8 tiles, test_int8_tiles.py; past
    # them, AMX-BF16 tiles from layer.amx_min_rows rows) gives the same bits
    if rows <= layer.int8_tile_rows:
        fewest = 1
    else:
        fewest = max(layer.amx_min_rows, layer.int8_tile_rows + 1) if layer.amx_min_rows else 1
    assert torch.equal(layer.product(x[-fewest:])[-1:], product[-1:])
    layer.dense_rows = 1  # every call: W widened into Bf16DotLinear's layout, then its GEMM
    dense = layer.product(x)
    assert dense.dtype is torch.bfloat16
    expected = F.linear(x.float(), weight.dequantize().bfloat16().float())
    assert (dense.float() - expected).abs().max() <= 1e-2 * expected.abs().max()  # bf16 output
    if layer.amx_min_rows == 0:  # on vdpbf16ps a row's bits depend on it alone
        assert torch.equal(layer.product(x[-1:]), dense[-1:])


def float16_exact_weight(kind, out, width, group_size, gen):
    """Factors as GGUF stores them: float16 scales d (and, for 4 bits, Q4_1's float16 minimum
    m: zero = m + 8 d, so the kernels' offset zero - 8 d is m again; Q5_1's zero m, the
    offset itself for 8 bits)."""
    weight = WEIGHTS[kind](out, width, group_size, gen)
    weight.scales = weight.scales.half().float()
    if kind == "int4":
        weight.zeros = weight.zeros.half().float() + 8 * weight.scales
    elif weight.zeros is not None:
        weight.zeros = weight.zeros.half().float()
    return weight


@pytest.mark.parametrize("kind,group_size", [("int4", 32), ("int8", 32), ("int8", 64),
                                             ("int8-zeros", 32), ("int8-wide-zeros", 64),
                                             ("int8-iq4", 32), ("int8-five", 32),
                                             ("int8-narrow-zeros", 32)])
def test_column_layout_keeps_exact_factors_in_float16_with_the_same_bits(cpu_isa, kind, group_size):
    """Factors that float16 holds exactly are kept in float16 (half the bytes a decode step
    reads besides the levels), others in float32; every path reads either to the same bits:
    the column kernels (vdpbf16ps and AMX tiles), AMX-INT8 tiles (8 bits), the dense path and
    the dequantized weight."""
    gen = torch.Generator().manual_seed(group_size)
    linear = LINEARS[kind]
    layer = linear(float16_exact_weight(kind, 70, 256, group_size, gen), False, torch.bfloat16)
    if not layer.column_outputs:
        pytest.skip(f"the column layout is the avx512_bf16 level's; this run is {cpu_isa}")
    assert layer.scales.dtype is torch.float16
    assert linear(WEIGHTS[kind](70, 256, group_size, gen),
                  False, torch.bfloat16).scales.dtype is torch.float32  # random: not exact
    if kind == "int4":
        assert layer.offsets.dtype is torch.float16
    elif kind.endswith("zeros"):  # the offsets are the zeros
        assert layer.offsets is layer.zeros and layer.zeros.dtype is torch.float16
    wide = linear(float16_exact_weight(kind, 70, 256, group_size,
                                       torch.Generator().manual_seed(group_size)),
                  False, torch.bfloat16)
    wide.scales = wide.scales.float()
    wide.offsets = None if wide.offsets is None else wide.offsets.float()
    wide.zeros = None if wide.zeros is None else wide.zeros.float()
    assert torch.equal(layer.levels, wide.levels)
    assert torch.equal(layer.dequantized_weight(), wide.dequantized_weight())
    x = torch.randn(13, 256, generator=gen).bfloat16()
    k = layer.kernels
    for amx_min_rows in (0, 1):
        assert torch.equal(
            k.column_gemm(x, layer.levels, layer.scales, layer.offsets, group_size, 70, amx_min_rows),
            k.column_gemm(x, wide.levels, wide.scales, wide.offsets, group_size, 70, amx_min_rows))
        assert torch.equal(
            k.column_dense(x, layer.levels, layer.scales, layer.zeros, group_size, 70, amx_min_rows),
            k.column_dense(x, wide.levels, wide.scales, wide.zeros, group_size, 70, amx_min_rows))
    if kind == "int8" and group_size % 64 == 0 and k.amx_int8_ready():
        assert torch.equal(k.int8_tile_gemm(x[:5], layer.levels, layer.scales, group_size, 70),
                           k.int8_tile_gemm(x[:5], wide.levels, wide.scales, group_size, 70))


@pytest.mark.parametrize("kind", ["int4", "int8", "int8-zeros", "int8-wide-zeros", "int8-iq4",
                                  "int8-five"])
def test_the_dense_path_widens_each_group_for_every_block_of_rows(cpu_isa, kind):
    """300 rows: two blocks of 256 rows, each widening every column group into the thread's
    buffer again; every row as it would be alone, and the dequantized weight's product."""
    gen = torch.Generator().manual_seed(7)
    weight, layer = vdpbf16ps_column_linear(cpu_isa, kind, 32, gen, "dense path")
    layer.dense_rows = 1
    x = torch.randn(300, 256, generator=gen).bfloat16()
    dense = layer.product(x)
    expected = F.linear(x.float(), weight.dequantize().bfloat16().float())
    assert (dense.float() - expected).abs().max() <= 1e-2 * expected.abs().max()
    for row in (0, 255, 256, 299):
        assert torch.equal(layer.product(x[row:row + 1]), dense[row:row + 1])


# out 40 and 70: a short last column group (70 also cuts a block of 4 outputs); groups of 16,
# 32, 128 and one per channel; 30 rows: one row block; 300: two, each widening every group
@pytest.mark.parametrize("kind,group_size,out", [("int4", 16, 70), ("int4", 32, 40),
                                                 ("int4", 128, 70), ("int8", 32, 70),
                                                 ("int8", 256, 40), ("int8-zeros", 32, 70),
                                                 ("int8-iq4", 32, 40)])
@pytest.mark.parametrize("rows", [30, 300])
def test_the_row_layouts_dense_path_multiplies_bfloat16_weights_on_bf16_dot(cpu_isa, kind,
                                                                           group_size, out,
                                                                           rows):
    """At the avx2 and avx512 levels a bfloat16 linear keeps the row layout, and its many-rows
    path (row_layout_dense) gives bf16_dot_linear's bits for the bfloat16 of the dequantized
    weight: widened a column group at a time, each value rounded to nearest even, nothing
    else in between; a row alone gives the same bits. float32 linears and W8A8 (exact
    integer sums) keep the float32 dense product."""
    gen = torch.Generator().manual_seed(rows + group_size + out)
    make, linear = weight_and_linear(kind)
    weight = make(out, 256, group_size, gen)
    layer = linear(weight, False, torch.bfloat16)
    assert layer.row_dense == (cpu_isa in ("avx2", "avx512"))
    if not layer.row_dense:
        pytest.skip(f"the row layout's bf16_dot dense path is the avx2 and avx512 levels'; "
                    f"this run is {cpu_isa}")
    assert not linear(weight, False, torch.float32).row_dense
    per_channel = int8_weight(out, 256, 256, gen)
    per_channel.activations_int8 = True
    assert not W8A8Linear(per_channel, False, torch.bfloat16).row_dense
    layer.dense_rows = 1
    x = torch.randn(rows, 256, generator=gen).bfloat16()
    dense = layer.product(x)
    kernels = layer.kernels
    packed = kernels.pack_bf16_dot_weight(weight.dequantize().bfloat16())
    assert dense.dtype is torch.bfloat16
    assert torch.equal(dense, kernels.bf16_dot_linear(x, packed, out, None, 0))
    for row in (0, rows - 1):
        assert torch.equal(layer.product(x[row:row + 1]), dense[row:row + 1])
    layer.dense_rows = rows + 1  # fewer rows: the row kernels' float32 sums
    assert layer.product(x).dtype is torch.float32


@pytest.mark.parametrize("kind", ["int4", "int8", "int8-wide-zeros"])
def test_every_row_of_a_column_call_gets_the_bits_it_gets_alone(cpu_isa, kind):
    """On vdpbf16ps a row's sums run in one order whatever the rows beside it: 13 rows are
    tiles of 4, 4, 4 and 1 rows over both halves of each column group for 4 bits, and tiles
    of 8 and 5 rows by halves (16 outputs a pass) for full-range 8-bit levels; every row
    equals its product alone, and the product is the dequantized weight's."""
    gen = torch.Generator().manual_seed(13)
    weight, layer = vdpbf16ps_column_linear(cpu_isa, kind, 64, gen, "column kernel")
    layer.dense_rows = 14
    x = torch.randn(13, 256, generator=gen).bfloat16()
    product = layer.product(x)
    expected = F.linear(x.double(), weight.dequantize().double())
    torch.testing.assert_close(product.double(), expected, atol=1e-5, rtol=1e-5)
    for row in range(13):
        assert torch.equal(layer.product(x[row:row + 1]), product[row:row + 1]), row


# 8-bit levels with one scale per output (groups of 128 = the width) and grouped ones beside
@pytest.mark.parametrize("kind,group_size", [("int8", 128), ("int8-wide-zeros", 128),
                                             ("int8", 32), ("int4", 32)])
def test_every_row_of_a_row_kernel_call_gets_the_bits_it_gets_alone(cpu_isa, kind, group_size):
    """The row layout's float32 kernels sum a row in one order whatever the rows beside it.
    In the avx2 build 8-bit levels with one scale per output take up to 10 rows a pass: 9
    in one, 12, 13 and 25 in passes of equal size (6 and 6; 7 and 6; 9, 8 and 8); grouped
    levels take passes of 8 (4-bit: 4), the AVX-512 builds passes of 8. Every row equals its
    product alone, and the product is the dequantized weight's."""
    gen = torch.Generator().manual_seed(9)
    make, linear = weight_and_linear(kind)
    weight = make(40, 128, group_size, gen)
    layer = linear(weight, False, torch.float32)
    assert layer.kernels is not None  # the C++ kernels of this level
    for rows in (9, 12, 13, 25):
        layer.dense_rows = rows + 1  # the row kernels
        x = torch.randn(rows, 128, generator=gen)
        product = layer.product(x)
        expected = F.linear(x.double(), weight.dequantize().double())
        torch.testing.assert_close(product.double(), expected, atol=1e-4, rtol=1e-4)
        for row in range(rows):
            assert torch.equal(layer.product(x[row:row + 1]), product[row:row + 1]), (rows, row)


@pytest.mark.parametrize("threads", [1, 3])
def test_column_kernels_give_the_same_bits_however_many_threads_claim_the_groups(cpu_isa, threads,
                                                                                 torch_threads):
    """Column groups are claimed by the threads as they go (claimed_ranges.h): 1 or 3 threads
    (more than this machine's cores, some ranges left to thieves) give the bits of the
    default team, on the row kernels and on the widened dense path."""
    gen = torch.Generator().manual_seed(8)
    layer = Int4Linear(int4_weight(200, 256, 32, gen), False, torch.bfloat16)
    if not layer.column_outputs or layer.amx_min_rows:
        pytest.skip(f"the vdpbf16ps column kernels are the avx512_bf16 level's without AMX; this "
                    f"run is {cpu_isa}{' with AMX tiles' if layer.amx_min_rows else ''}")
    x = torch.randn(300, 256, generator=gen).bfloat16()
    calls = {"rows": (x[:9], 10), "dense": (x, 1)}
    expected = {}
    for name, (rows, dense_rows) in calls.items():
        layer.dense_rows = dense_rows
        expected[name] = layer.product(rows)
    torch_threads(threads)
    for name, (rows, dense_rows) in calls.items():
        layer.dense_rows = dense_rows
        assert torch.equal(layer.product(rows), expected[name]), name


def test_without_the_cpp_kernels_every_call_is_dense():
    gen = torch.Generator().manual_seed(0)
    weight = int4_weight(8, 64, 32, gen)
    layer = Int4Linear(weight, True, torch.float32)
    layer.kernels = None  # as on a machine where the extension does not build
    layer.bias.data.normal_(generator=gen)
    x = torch.randn(2, 64, generator=gen)
    torch.testing.assert_close(layer(x), F.linear(x, weight.dequantize(), layer.bias))


@pytest.mark.parametrize("kernel", ["auto", *W8A8_KERNELS])
@pytest.mark.parametrize("rows", [1, 5, 6, 40])
def test_w8a8_is_the_integer_product_of_per_token_levels(monkeypatch, kernel, rows):
    use_w8a8_kernel(monkeypatch, kernel)
    gen = torch.Generator().manual_seed(rows)
    weight = int8_weight(24, 64, 64, gen)
    weight.activations_int8 = True
    x = torch.randn(rows, 64, generator=gen)
    x[rows // 2] = 0  # a zero row: scale 1, levels 0
    layer = quantized_linear([weight], False, torch.float32)
    assert type(layer) is W8A8Linear
    scale = (x.abs().amax(1, keepdim=True) / 127).double()
    scale[rows // 2] = 1
    levels = torch.round(x.double() / scale).clamp(-128, 127)
    expected = (levels @ weight.q.double().T) * scale * weight.scales[:, 0].double()
    torch.testing.assert_close(layer(x).double(), expected, atol=1e-5, rtol=1e-5)


def _rows_near_half_levels(gen: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """float32 rows whose values sit within a few units in the last place of (n + 1/2) times
    their row's scale (``absmax / 127``): where the level depends on the quotient's last bit
    (a multiplication by 1 / scale instead of the division rounds some of them otherwise)."""
    amax = torch.rand(rows, 1, generator=gen) * 10 + 0.01
    scale = amax / 127
    n = torch.randint(-127, 127, (rows, width), generator=gen).float()
    x = (n + 0.5) * scale
    steps = torch.randint(-3, 4, (rows, width), generator=gen)
    for _ in range(3):  # up to 3 ulps either way
        x = torch.where(steps > 0, torch.nextafter(x, torch.full_like(x, 1e30)), x)
        x = torch.where(steps < 0, torch.nextafter(x, torch.full_like(x, -1e30)), x)
        steps = steps - steps.sign()
    x[:, 0] = amax[:, 0]  # the row's largest magnitude: its scale
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_quantized_with_the_torch_formulas_bits(cpu_isa, dtype):
    """The C++ ``token_levels`` (every W8A8 and W4A8 call) gives ``per_token_levels``' levels
    at every level's build: rows within ulps of half-integer levels, random rows, a row of
    zeros, rows of subnormal values. Read through ``w8a8_product`` with an identity weight
    (exact integer sums, times 1, times the row's scale: the levels' bits)."""
    from paged_core.cpu.extension import cpu_ops

    gen = torch.Generator().manual_seed(7)
    width = 96
    x = torch.cat([_rows_near_half_levels(gen, 600, width), torch.randn(64, width, generator=gen),
                   torch.zeros(1, width), torch.randn(2, width, generator=gen) * 1e-39])
    x = x.to(dtype)
    eye = torch.eye(width, dtype=torch.int8)
    y = cpu_ops(cpu_isa).w8a8_product(x, eye, torch.ones(width), None, 1, 24, torch.float32)
    levels, scale = per_token_levels(x)
    assert torch.equal(y, levels * scale)


@pytest.mark.parametrize("setting,vnni_ready,amx_ready,amx_selected,int8_dot,chosen", [
    ("", True, False, True, True, ("vnni", 1, 0)),
    ("", True, True, True, True, ("vnni", 1, AMX_FROM_ROWS)),
    ("auto", True, True, False, True, ("vnni", 1, 0)),
    ("vnni", True, True, True, True, ("vnni", 1, 0)),
    (" AMX ", True, True, False, True, ("amx", 1, 1)),
    ("auto", False, False, True, True, ("onednn", ONEDNN_FROM_ROWS, 0)),
    ("auto", False, False, True, False, ("float32", 0, 0)),
    ("onednn", False, False, True, False, ("onednn", 1, 0)),
    (" VNNI ", True, False, True, True, ("vnni", 1, 0)),
    ("float32", True, True, True, True, ("float32", 0, 0))])
def test_the_w8a8_setting_picks_a_kernel(monkeypatch, setting, vnni_ready, amx_ready,
                                         amx_selected, int8_dot, chosen):
    """``PAGED_CORE_CPU_W8A8``: ``auto`` takes paged-core's vnni kernel where it runs, its calls
    from ``AMX_FROM_ROWS`` rows on AMX-INT8 tiles where those run and the bfloat16 linears take
    AMX, else oneDNN's int8 GEMM from ``ONEDNN_FROM_ROWS`` rows on CPUs with int8 dot products,
    else the float32 kernels; a kernel named takes every call."""
    monkeypatch.setenv(W8A8_SETTING, setting)
    caps = {flag: False for flag in ("avx512_vnni", "avx_vnni", "amx_int8")}
    caps["avx_vnni"] = int8_dot
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    kernels = SimpleNamespace(int8_vnni_ready=lambda: vnni_ready)
    if amx_ready:  # the op exists in the avx512_bf16 build alone
        kernels.amx_int8_ready = lambda: True
    assert selected_w8a8_kernel(kernels, amx_selected) == chosen
    if not vnni_ready:
        assert selected_w8a8_kernel(None, amx_selected) == chosen  # no C++ kernels at all


@pytest.mark.parametrize("setting,amx_ready,message", [
    ("int8", False, "'int8' is not a W8A8 kernel"), ("vnni", False, "vnni needs paged-core's AVX-512"),
    ("amx", False, "amx needs paged-core's avx512_bf16 kernels"),
    ("amx", True, "amx needs paged-core's avx512_bf16 kernels")])
def test_w8a8_kernels_that_cannot_be_taken_are_refused_naming_the_setting(monkeypatch, setting,
                                                                           amx_ready, message):
    """A kernel name it does not know, or one this CPU cannot run (AMX-INT8 tiles need the
    vnni layout's kernels as well: refused without them, even where the tiles are granted)."""
    monkeypatch.setenv(W8A8_SETTING, setting)
    kernels = SimpleNamespace(int8_vnni_ready=lambda: False)
    if amx_ready:
        kernels.amx_int8_ready = lambda: True
    with pytest.raises(ValueError, match=f"{W8A8_SETTING}={message}"):
        selected_w8a8_kernel(kernels)


@pytest.mark.parametrize("kernel", ["vnni", "amx", "onednn"])
@pytest.mark.parametrize("rows", [1, 5, 9, 12, 64])
def test_w8a8_integer_kernels_give_the_exact_sums_scaled(monkeypatch, kernel, rows):
    """vnni, amx and onednn take exactly the int64 sums of the levels, times the channel's
    scale, then the token's, in float32: the same bits for every row count (bfloat16 rows, 1536
    features, sums past 2^24, 40 outputs: a partial group of 16), and the layer's bfloat16
    output is those rounded; the float32 kernels differ in the last bits there, and are close
    below ``dense_rows`` (past it they multiply the dequantized weight in bfloat16)."""
    use_w8a8_kernel(monkeypatch, kernel)
    gen = torch.Generator().manual_seed(rows)
    weight = int8_weight(40, 1536, 1536, gen)
    weight.q[0] = 127  # with inputs near 1 (levels near 127) its sums pass 2^24
    weight.activations_int8 = True
    x = (1 + torch.randn(rows, 1536, generator=gen) * 0.01).bfloat16()
    layer = W8A8Linear(weight, False, torch.bfloat16)
    y = layer.product(x)
    xf = x.float()
    scale = xf.abs().amax(1, keepdim=True) / 127
    levels = torch.round(xf / scale).clamp(-128, 127)
    sums = levels.long() @ weight.q.long().T
    assert sums.abs().max() > 2 ** 24  # past float32's exact integers
    expected = (sums.float() * weight.scales[:, 0]) * scale
    assert torch.equal(y, expected)
    assert torch.equal(layer(x), expected.bfloat16())
    monkeypatch.setenv(W8A8_SETTING, "float32")
    float_layer = W8A8Linear(weight, False, torch.bfloat16)
    float_sums = float_layer.product(x)
    assert not torch.equal(float_sums, expected)
    if rows < float_layer.dense_rows:
        torch.testing.assert_close(float_sums, expected, atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["vnni", "amx"])
@pytest.mark.parametrize("rows,features,outputs", [(1, 70, 33), (8, 65, 16), (11, 4, 17),
                                                   (17, 130, 48), (33, 64, 16), (40, 200, 33)])
def test_the_vnni_layout_takes_any_width_and_output_count(monkeypatch, kernel, rows, features,
                                                          outputs):
    """``w8a8_product`` on ``w8a8_vnni_pack``'s layout (features padded with zero levels to
    whole tile steps of 64) where the features are no multiple of 4 and the outputs no
    multiple of 16, on vpdpbusd and on AMX-INT8 tiles (blocks of up to 32 rows, a last short
    one, an odd count of groups of 16): zero padding adds nothing; the exact sums, scaled,
    with a zero row (scale 1); asked for bfloat16, those sums rounded as ``.to`` rounds."""
    use_w8a8_kernel(monkeypatch, kernel)
    from paged_core.cpu.extension import cpu_ops

    ops = cpu_ops()
    gen = torch.Generator().manual_seed(features)
    q = torch.randint(-128, 128, (outputs, features), generator=gen, dtype=torch.int8)
    channel_scales = torch.rand(outputs, generator=gen)
    x = torch.randn(rows, features, generator=gen)
    x[0] = 0
    packed, vnni_sums = ops.w8a8_vnni_pack(q)
    assert packed.shape == ((outputs + 15) // 16, (features + 63) // 64 * 16, 16, 4)
    tiles_from = 1 if kernel == "amx" else 0
    y = ops.w8a8_product(x, packed, channel_scales, vnni_sums, 1, 24, torch.float32, tiles_from)
    scale = x.abs().amax(1, keepdim=True) / 127
    scale[0] = 1
    levels = torch.round(x / scale).clamp(-128, 127)
    expected = ((levels.long() @ q.long().T).float() * channel_scales) * scale
    assert torch.equal(y, expected)
    rounded = ops.w8a8_product(x, packed, channel_scales, vnni_sums, 1, 24, torch.float32,
                               tiles_from, torch.bfloat16)
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, expected.bfloat16())


def test_parts_of_different_kinds_run_side_by_side():
    gen = torch.Generator().manual_seed(0)
    parts = [int4_weight(16, 64, 32, gen), int8_weight(8, 64, 16, gen)]
    layer = quantized_linear(parts, True, torch.float32)
    assert type(layer) is ConcatLinear
    layer.bias.data.normal_(generator=gen)
    x = torch.randn(3, 64, generator=gen)
    dense = torch.cat([p.dequantize() for p in parts])
    torch.testing.assert_close(layer(x), F.linear(x, dense, layer.bias), atol=1e-4, rtol=1e-4)


def test_group_sizes_the_kernels_cannot_take_are_refused():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="multiple of 16"):
        Int4Linear(int4_weight(8, 96, 24, gen), False, torch.float32)


@pytest.mark.parametrize("kernel", ["bf16_dot", "amx"])
@pytest.mark.parametrize("kind,width", [("int4", 64), ("int8", 64), ("int4", 48),
                                        ("int8-zeros", 64), ("int8-wide-zeros", 64),
                                        ("int8-iq4", 64), ("int8-five", 64)])
@pytest.mark.parametrize("rows", [70, 300])
def test_gate_ups_dense_path_fuses_silu_and_mul_bit_for_bit(monkeypatch, kernel, kind, width,
                                                          rows):
    """A gate_up's many-rows product goes straight into SiLU-and-mul (each unit's gate and up
    column groups widened together, on AMX tiles or vdpbf16ps): the bits of the product and
    then the level's silu_and_mul, without the [rows, 2 * width] product. Width 48 is not
    whole column groups: the two ops run one after the other."""
    from paged_core.cpu.extension import cpu_extension_available, cpu_ops
    from paged_core.cpu.isa import LINEAR_SETTING, has_amx_bf16, unsupported_reason

    if unsupported_reason("avx512_bf16") or not cpu_extension_available("avx512_bf16"):
        pytest.skip(f"the column layout is the avx512_bf16 level's: "
                    f"{unsupported_reason('avx512_bf16') or 'its kernels do not build here'}")
    if kernel == "amx" and not has_amx_bf16():
        pytest.skip("this CPU lacks amx_bf16 (needed by PAGED_CORE_CPU_LINEAR=amx)")
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "avx512_bf16")
    monkeypatch.setenv(LINEAR_SETTING, kernel)
    gen = torch.Generator().manual_seed(rows + width)
    make, linear = weight_and_linear(kind)
    try:
        layer = linear(make(2 * width, 256, 32, gen), False, torch.bfloat16)
    except RuntimeError as error:  # amx where the CPU or OS gives no tiles
        pytest.skip(str(error))
    assert layer.column_outputs and bool(layer.amx_min_rows) == (kernel == "amx")
    assert rows >= layer.dense_rows  # the dense path
    x = torch.randn(rows, 256, generator=gen).bfloat16()
    expected = torch.empty(rows, width, dtype=torch.bfloat16)
    cpu_ops("avx512_bf16").silu_and_mul(layer(x).contiguous(), expected)
    fused = layer.dense_silu_and_mul(x)
    assert fused is not None and torch.equal(fused.view(torch.int16), expected.view(torch.int16))
    assert layer.dense_silu_and_mul(x[:layer.dense_rows - 1]) is None  # the column kernels' rows


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_groups_that_amx_tiles_cannot_take_go_dense_early_where_the_tiles_run(monkeypatch, kind):
    """With AMX tiles granted, a column-layout linear whose groups are whole tile steps keeps
    its tile kernel up to COLUMN_AMX_DENSE_ROWS rows (by bits); groups of 16 (GGUF Q6_K), which the
    column kernel multiplies on vdpbf16ps, widening its levels again every 4 rows, take the
    dense path (AMX GEMM) from COLUMN_UNTILED_DENSE_ROWS; without tiles both keep the
    vdpbf16ps threshold. Each still equals the dequantized product on both sides of it."""
    from paged_core.cpu.extension import cpu_extension_available
    from paged_core.quantization import quantized_linear as ql

    if not cpu_extension_available("avx512_bf16"):
        pytest.skip("the column layout needs the avx512_bf16 kernels (AVX512-BF16): this CPU "
                    "lacks them")
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", "avx512_bf16")
    gen = torch.Generator().manual_seed(5)
    make = (lambda g: Int4Linear(int4_weight(40, 128, g, gen), False, torch.bfloat16)) \
        if kind == "int4" else (lambda g: Int8Linear(int8_weight(40, 128, g, gen), False,
                                                     torch.bfloat16))
    vdpbf16ps_rows = ql.COLUMN_DENSE_ROWS[8 if kind == "int8" else 4]
    bits = 8 if kind == "int8" else 4
    for amx_rows, expected in ((2, {32: ql.COLUMN_AMX_DENSE_ROWS[bits],
                                    16: ql.COLUMN_UNTILED_DENSE_ROWS}),
                               (0, {32: vdpbf16ps_rows, 16: vdpbf16ps_rows})):
        monkeypatch.setattr("paged_core.models.cpu_linear.bf16_amx_min_rows", lambda: amx_rows)
        for group_size, dense_rows in expected.items():
            layer = make(group_size)
            assert layer.column_outputs and layer.dense_rows == dense_rows
            if amx_rows == 0 or not layer.kernels.bf16_amx_ready():
                continue
            weight = layer.dequantized_weight()
            for rows in (dense_rows - 1, dense_rows):
                x = torch.randn(rows, 128, generator=gen).bfloat16()
                expected_y = F.linear(x.float(), weight.bfloat16().float())
                y = layer(x).float()
                assert (y - expected_y).abs().max() <= 1e-2 * expected_y.abs().max()
