"""The Triton LoRA products (``paged_core.kernels.lora``, what CUDA models run through
``lora.products.TritonLoRAProducts``) against a float64 reference: each row its own adapter's
products, rows without an adapter and padding rows left alone; float32 and bfloat16 rows and
tables; bad arguments refused naming them."""
import pytest
import torch

from paged_core.lora.products import LoRABatch, SlotWidths, TritonLoRAProducts

from tests.lora_products_cases import expected_expand, expected_shrink, make_step

CASES = [(torch.float32, torch.float32, 1e-5), (torch.bfloat16, torch.float32, 1e-2),
         (torch.bfloat16, torch.bfloat16, 1e-2)]


def on(step, device):
    """``step`` with its tensors on ``device``."""
    widths = SlotWidths(len(step.widths.values), device)
    for slot, width in enumerate(step.widths.values):
        widths.set(slot, width)
    batch = LoRABatch(step.batch.token_slots.to(device))
    return type(step)(step.x.to(device), step.y.to(device), step.a.to(device),
                      step.b_t.to(device), widths, step.part_starts, batch)


@pytest.mark.parametrize("dtype,table_dtype,tol", CASES, ids=str)
def test_each_row_gets_its_own_adapter(device, dtype, table_dtype, tol):
    step = make_step(dtype, table_dtype=table_dtype)
    mine = on(step, device)
    products = TritonLoRAProducts()
    u = products.shrink(mine.x, mine.a, mine.widths, mine.batch)
    torch.testing.assert_close(u.cpu().double(), expected_shrink(step), rtol=tol, atol=tol)
    y_before, expected = step.y.clone(), expected_expand(step, u.cpu())
    products.expand(mine.y, u, mine.b_t, mine.widths, mine.part_starts, mine.batch)
    torch.testing.assert_close(mine.y.cpu().double(), expected, rtol=tol, atol=tol * 10)
    untouched = [1, 9, 10, 11, 12]  # no adapter (-1), and the padding rows
    assert torch.equal(mine.y.cpu()[untouched], y_before[untouched])


def test_bad_arguments_are_named(device):
    step = on(make_step(torch.float32), device)
    products = TritonLoRAProducts()
    with pytest.raises(ValueError, match="widths must be int64"):
        products.shrink(step.x, step.a, SlotWidths(2, device), step.batch)
    with pytest.raises(ValueError, match="x must be"):
        products.shrink(step.x[:, :10], step.a, step.widths, step.batch)
    u = products.shrink(step.x, step.a, step.widths, step.batch)
    with pytest.raises(ValueError, match="u must be"):
        products.expand(step.y, u.double(), step.b_t, step.widths, step.part_starts, step.batch)
