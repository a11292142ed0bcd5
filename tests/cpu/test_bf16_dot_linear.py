"""The bfloat16 linear (``Bf16DotLinear``) at each level that builds it: ``vdpbf16ps``
(``avx512_bf16``) or two float32 FMAs per pair (``avx512``: 16 lanes, ``avx2``: 8 lanes, the
same bits). The exact product rounded once to bfloat16 (up to float32 summation), every
row's bits independent of the batch around it, any leading shape and row stride, and the
engine's choice of it. A level this CPU cannot run skips, saying why (float16 models and
``PAGED_CORE_CPU_LINEAR=onednn`` keep oneDNN's ``PackedLinear``, tested in
test_cpu_linear.py)."""
import pytest
import torch

from paged_core.cpu.isa import unsupported_reason
from paged_core.models.bf16_dot_linear import BF16_DOT_LEVELS, Bf16DotLinear
from paged_core.models.cpu_linear import PackedLinear, packed_linear



@pytest.fixture(params=BF16_DOT_LEVELS)
def level(request):
    """Each level whose build holds the kernel; skips where this CPU cannot run it."""
    reason = unsupported_reason(request.param)
    if reason is not None:
        pytest.skip(reason)
    return request.param


def _layer(out_features: int, in_features: int, with_bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    return weight, bias


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 9, 17, 300])
@pytest.mark.parametrize("out_features", [16, 50, 96, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_exact_product_rounded_once(rows, out_features, with_bias, level):
    weight, bias = _layer(out_features, 96, with_bias)
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = Bf16DotLinear(weight, bias, level=level)(x)
    exact = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    assert y.shape == (rows, out_features) and y.dtype == torch.bfloat16
    # float32 sums of 96 exact products, then one rounding to bfloat16 (half an ulp: 2^-9)
    magnitude = x.double().abs() @ weight.double().abs().T + 1
    assert ((y.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + magnitude * 96 * 2.0 ** -23).all()


def test_a_row_gives_the_same_bits_alone_or_in_any_batch(level):
    weight, bias = _layer(200, 128, True)
    layer = Bf16DotLinear(weight, bias, level=level)
    batch = torch.randn(300, 128, generator=torch.Generator().manual_seed(2)).bfloat16()
    full = layer(batch)
    for rows in (1, 2, 5, 8, 13, 257):
        assert torch.equal(layer(batch[:rows]), full[:rows])
    assert torch.equal(layer(batch[150:151]), full[150:151])


def test_any_leading_shape_and_row_stride(level):
    weight, _ = _layer(64, 96, False)
    layer = Bf16DotLinear(weight, None, level=level)
    wide = torch.randn(10, 200, generator=torch.Generator().manual_seed(3)).bfloat16()
    strided = wide[:, 8:104]  # rows 200 elements apart
    assert torch.equal(layer(strided), layer(strided.contiguous()))
    assert torch.equal(layer(strided.contiguous().view(2, 5, 96)), layer(strided).view(2, 5, 64))


def _compute_dtype(level: str) -> torch.dtype:
    """What a bfloat16 model's linears compute in at ``level`` (``packed_linear_dtype``)."""
    return torch.bfloat16 if level == "avx512_bf16" else torch.float32


def test_odd_in_features_keep_onednn_and_bad_inputs_say_what_is_wrong(monkeypatch, level):
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "bf16_dot")  # auto takes amx on AMX CPUs
    weight, _ = _layer(32, 95, False)
    assert not Bf16DotLinear.fits(weight)
    compute = _compute_dtype(level)
    assert isinstance(packed_linear(weight, None, compute, level), PackedLinear)
    chosen = packed_linear(_layer(32, 96, False)[0], None, compute, level)
    assert isinstance(chosen, Bf16DotLinear) and chosen.level == level
    assert chosen.compute_dtype == compute  # float32 FMAs at avx2/avx512, vdpbf16ps at avx512_bf16
    layer = Bf16DotLinear(_layer(32, 96, False)[0], None, level=level)
    with pytest.raises(RuntimeError, match="in_features = 96"):
        layer(torch.zeros(2, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="x must be bfloat16"):
        layer(torch.zeros(2, 96))


def test_the_setting_picks_onednn_or_bf16_dot(monkeypatch, level):  # amx: test_bf16_amx_linear.py
    weight = _layer(32, 96, False)[0]
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "onednn")
    onednn = packed_linear(weight, None, _compute_dtype(level), level)
    assert isinstance(onednn, PackedLinear) and onednn.compute_dtype == _compute_dtype(level)
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "bf16_dot")
    assert isinstance(packed_linear(weight, None, _compute_dtype(level), level), Bf16DotLinear)
    # float16 weights and the generic level keep oneDNN or F.linear (the setting unread)
    assert isinstance(packed_linear(weight.half(), None, torch.float32, level), PackedLinear)
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", "mkl")
    assert isinstance(packed_linear(weight, None, torch.float32, "generic"), PackedLinear)
    with pytest.raises(ValueError, match="PAGED_CORE_CPU_LINEAR='mkl'"):
        packed_linear(weight, None, _compute_dtype(level), level)


def test_amx_tiles_and_other_levels_are_refused():
    weight = _layer(32, 96, False)[0]
    with pytest.raises(ValueError, match="avx2 or avx512 or avx512_bf16 level, not generic"):
        Bf16DotLinear(weight, None, level="generic")
    with pytest.raises(ValueError, match="AMX tiles need the avx512_bf16 level"):
        Bf16DotLinear(weight, None, amx_min_rows=1, level="avx512")


@pytest.mark.parametrize("kernel", ["bf16_dot", "amx", "onednn"])
def test_a_bf16_engine_runs_the_chosen_kernel_and_buckets_only_for_onednn(kernel, monkeypatch,
                                                                          level):
    from paged_core import LLM, SamplingParams
    from paged_core.cpu.isa import has_amx_bf16
    from paged_core.models.cpu_linear import AMX_MIN_ROWS

    if kernel == "amx" and not has_amx_bf16():
        pytest.skip("this CPU lacks amx_bf16 (needed by PAGED_CORE_CPU_LINEAR=amx)")
    monkeypatch.setenv("PAGED_CORE_CPU_ISA", level)
    monkeypatch.setenv("PAGED_CORE_CPU_LINEAR", kernel)
    llm = LLM(dtype="bfloat16", num_kv_blocks=32)
    model = llm.engine.core.executor.runner.model
    expected = PackedLinear if kernel == "onednn" else Bf16DotLinear
    assert type(model.layers[0].mlp.down_proj) is expected and type(model.lm_head) is expected
    if kernel != "onednn":
        amx = kernel == "amx" and level == "avx512_bf16"  # only that build has AMX code
        assert model.lm_head.level == level
        assert model.lm_head.amx_min_rows == (AMX_MIN_ROWS if amx else 0)
    assert model.prefers_bucketed_batches == (kernel == "onednn")  # oneDNN: a kernel per row count
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4),
                       use_tqdm=False)[0].outputs[0]
    assert "Paris" in out.text


@pytest.mark.parametrize("rows", [1, 4, 5, 6, 7, 12, 13, 300])
@pytest.mark.parametrize("width", [32, 96, 48])  # 48: not whole 32-column groups
@pytest.mark.parametrize("with_bias", [False, True])
def test_silu_and_mul_in_the_epilogue_gives_the_two_ops_bits(rows, width, with_bias, level):
    from paged_core.models.elementwise import FusedCpuOps

    weight, bias = _layer(2 * width, 96, with_bias, seed=4)
    layer = Bf16DotLinear(weight, bias, level=level)
    gen = torch.Generator().manual_seed(5)
    # rows from small to large sums: SiLU's negative tail, its linear part, and inf * 0
    scale = torch.logspace(-2, 2, rows).unsqueeze(1)
    x = (torch.randn(rows, 96, generator=gen) * scale).bfloat16()
    if rows > 1:
        x[-1, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e30])
    expected = FusedCpuOps(level).silu_and_mul(layer(x))
    fused = layer.silu_and_mul(x)
    assert fused.shape == (rows, width) and fused.dtype == torch.bfloat16
    assert torch.equal(fused.view(torch.int16), expected.view(torch.int16))
    batched = layer.silu_and_mul(x.view(1, rows, 96))
    assert torch.equal(batched.view(torch.int16), fused.view(1, rows, width).view(torch.int16))


def test_silu_and_mul_needs_a_gate_up_product(level):
    layer = Bf16DotLinear(_layer(33, 96, False)[0], None, level=level)
    with pytest.raises(RuntimeError, match="must be even"):
        layer.silu_and_mul(torch.zeros(2, 96, dtype=torch.bfloat16))


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_the_bits_do_not_depend_on_how_many_threads_claim_the_work(threads, torch_threads, level):
    weight, bias = _layer(2 * 96, 128, True, seed=6)
    layer = Bf16DotLinear(weight, bias, level=level)
    x = torch.randn(600, 128, generator=torch.Generator().manual_seed(7)).bfloat16()  # 3 row blocks
    expected = {rows: (layer(x[:rows]), layer.silu_and_mul(x[:rows])) for rows in (1, 4, 600)}
    torch_threads(threads)
    for rows, (product, activated) in expected.items():
        assert torch.equal(layer(x[:rows]), product)
        assert torch.equal(layer.silu_and_mul(x[:rows]), activated)


def test_the_float32_levels_give_the_same_bits():
    """avx2's 8-lane FMAs and avx512's 16-lane ones add the same products in the same order
    and round alike: the same bits, tile shapes and partial column blocks included."""
    for level in ("avx2", "avx512"):
        if unsupported_reason(level) is not None:
            pytest.skip(unsupported_reason(level))
    weight, bias = _layer(2 * 100, 128, True, seed=8)  # 100: a partial 8- and 16-column block
    x = torch.randn(37, 128, generator=torch.Generator().manual_seed(9)).bfloat16()
    avx2, avx512 = (Bf16DotLinear(weight, bias, level=level) for level in ("avx2", "avx512"))
    for rows in (1, 2, 3, 37):
        assert torch.equal(avx2(x[:rows]).view(torch.int16), avx512(x[:rows]).view(torch.int16))
    weight, bias = _layer(2 * 96, 128, True, seed=10)  # whole groups: the fused epilogue
    avx2, avx512 = (Bf16DotLinear(weight, bias, level=level) for level in ("avx2", "avx512"))
    for rows in (1, 5, 37):
        assert torch.equal(avx2.silu_and_mul(x[:rows]).view(torch.int16),
                           avx512.silu_and_mul(x[:rows]).view(torch.int16))
