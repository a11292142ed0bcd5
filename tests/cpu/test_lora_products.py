"""The LoRA products of a step (``paged_core.lora.products``) on every CPU path (the C++ ops
of each ``cpu_isa`` build) and in plain torch: each row gets its own adapter's products (a
float64 reference within float32 rounding), rows without an adapter, slots without one and
padding rows past the step are left alone, ``y`` is rounded once; ``apply`` gives the bits of
``shrink`` then ``expand``, however many threads share the step."""
import pytest
import torch

from paged_core.lora.products import CpuLoRAProducts, TorchLoRAProducts

from ..lora_products_cases import expected_expand, expected_shrink, make_step

DTYPES = [torch.float32, torch.bfloat16]


def check_apply_gives_the_bits_of_shrink_then_expand(products, step) -> None:
    y = step.y.clone()
    products.apply(y, step.x, step.a, step.b_t, step.widths, step.part_starts, step.batch)
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    products.expand(step.y, u, step.b_t, step.widths, step.part_starts, step.batch)
    assert torch.equal(y, step.y)


def check_each_row_gets_its_own_adapter(products, dtype: torch.dtype,
                                        table_dtype: torch.dtype = torch.float32) -> None:
    step = make_step(dtype, table_dtype=table_dtype)
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    assert u.dtype == torch.float32 and u.shape == (10, 24)
    torch.testing.assert_close(u.double(), expected_shrink(step), rtol=1e-5, atol=1e-5)
    y_before, expected = step.y.clone(), expected_expand(step, u)
    products.expand(step.y, u, step.b_t, step.widths, step.part_starts, step.batch)
    if dtype == torch.float32:
        torch.testing.assert_close(step.y.double(), expected, rtol=1e-5, atol=1e-5)
    else:  # one rounding of the float32 sum: at most half a bfloat16 unit off the exact sum
        diff = (step.y.double() - expected).abs()
        assert bool((diff <= expected.abs() * 2 ** -8 + 1e-6).all()), diff.max()
    untouched = [1, 9, 10, 11, 12]  # no adapter (-1), and the padding rows
    assert torch.equal(step.y[untouched], y_before[untouched])
    check_apply_gives_the_bits_of_shrink_then_expand(
        products, make_step(dtype, table_dtype=table_dtype))


def check_a_whole_step_under_one_adapter(products,
                                        table_dtype: torch.dtype = torch.float32) -> None:
    step = make_step(torch.float32, token_slots=(1,) * 9, padding=0, widths=(24, 7, 16, 0),
                     part_starts=(0, 1100), table_dtype=table_dtype)  # one part: the whole table
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    torch.testing.assert_close(u.double(), expected_shrink(step), rtol=1e-5, atol=1e-5)
    expected = expected_expand(step, u)
    products.expand(step.y, u, step.b_t, step.widths, step.part_starts, step.batch)
    torch.testing.assert_close(step.y.double(), expected, rtol=1e-5, atol=1e-5)


def check_slots_with_many_rows(products, dtype: torch.dtype,
                               table_dtype: torch.dtype = torch.float32) -> None:
    """A prompt chunk under one adapter beside decodes under others (the C++ ops run a slot
    with 32 rows or more as GEMMs, the rest in their row kernels)."""
    slots = (0,) * 20 + (2, -1, 2, 1, -1) + (0,) * 17
    step = make_step(dtype, token_slots=slots, widths=(24, 8, 16, 0), part_starts=(0, 550, 1100),
                     table_dtype=table_dtype)
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    torch.testing.assert_close(u.double(), expected_shrink(step), rtol=1e-5, atol=1e-5)
    y_before, expected = step.y.clone(), expected_expand(step, u)
    products.expand(step.y, u, step.b_t, step.widths, step.part_starts, step.batch)
    diff = (step.y.double() - expected).abs()
    ulp = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
    assert bool((diff <= expected.abs() * ulp + 1e-5).all()), diff.max()
    untouched = [21, 24, 42, 43, 44]
    assert torch.equal(step.y[untouched], y_before[untouched])
    check_apply_gives_the_bits_of_shrink_then_expand(
        products, make_step(dtype, token_slots=slots, widths=(24, 8, 16, 0),
                            part_starts=(0, 550, 1100), table_dtype=table_dtype))


@pytest.mark.parametrize("table_dtype", DTYPES, ids=lambda d: f"tables-{d}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_ops(cpu_isa, dtype, table_dtype):
    """Tables of either dtype (the reference reads the same, widened, table values)."""
    check_each_row_gets_its_own_adapter(CpuLoRAProducts(cpu_isa), dtype, table_dtype)
    check_a_whole_step_under_one_adapter(CpuLoRAProducts(cpu_isa), table_dtype)
    check_slots_with_many_rows(CpuLoRAProducts(cpu_isa), dtype, table_dtype)


@pytest.mark.parametrize("token_slots", [(0,) * 13 + (-1,) + (0,) * 11, (1, 0) * 9],
                         ids=["one-slot", "two-slots"])
def test_cpu_ops_on_threads(cpu_isa, token_slots):
    """A step big enough to share between threads (one slot's rows split between them, or
    a slot each) gives the bits it gives on one thread, and the right sums."""
    products = CpuLoRAProducts(cpu_isa)
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (1, 4):
            torch.set_num_threads(count)
            step = make_step(torch.bfloat16, in_features=1500, out_features=1500,
                             token_slots=token_slots, widths=(96, 64), max_width=96,
                             part_starts=(0, 700, 1500), table_dtype=torch.bfloat16)
            expected = expected_expand(step, expected_shrink(step))
            products.apply(step.y, step.x, step.a, step.b_t, step.widths, step.part_starts,
                           step.batch)
            outputs.append(step.y)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[1])
    diff = (outputs[1].double() - expected).abs()
    assert bool((diff <= expected.abs() * 2 ** -8 + 1e-4).all()), diff.max()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch(dtype):
    check_each_row_gets_its_own_adapter(TorchLoRAProducts(), dtype)
    check_a_whole_step_under_one_adapter(TorchLoRAProducts())
    check_slots_with_many_rows(TorchLoRAProducts(), dtype)


def test_bad_slots_and_tables_are_refused(cpu_isa):
    products = CpuLoRAProducts(cpu_isa)
    step = make_step(torch.float32, token_slots=(0, 4))
    with pytest.raises(RuntimeError, match=r"token_slots\[1\] = 4"):
        products.shrink(step.x, step.a, step.widths, step.batch)
    step = make_step(torch.float32, table_dtype=torch.float16)
    with pytest.raises(RuntimeError, match="contiguous float32 or bfloat16"):
        products.shrink(step.x, step.a, step.widths, step.batch)
    step = make_step(torch.float32)
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    with pytest.raises(RuntimeError, match="part_starts must rise from 0"):
        products.expand(step.y, u, step.b_t, step.widths, [0, 500], step.batch)
    with pytest.raises(RuntimeError, match="width of 9 is not a multiple of the 2 parts"):
        products.expand(step.y, u, step.b_t, step.widths, [0, 500, 1100], step.batch)
    with pytest.raises(RuntimeError, match="x and y must have one dtype"):
        products.apply(step.y.bfloat16(), step.x, step.a, step.b_t, step.widths,
                       step.part_starts, step.batch)
