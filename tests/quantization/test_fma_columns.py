"""8- and 4-bit levels in column groups of 32 outputs for float32 FMAs (``column_groups``,
``int4_columns``): a bfloat16 ``Int8Linear`` or ``Int4Linear`` at the ``avx2`` and ``avx512``
levels keeps them there, multiplies few rows in float32 FMAs straight from the levels
(``quantized_fma_columns.cpp``) and many rows by widening each column group to bfloat16 once
(the row layout's many-rows bits); the other levels skip, saying so."""
import pytest
import torch
import torch.nn.functional as F

from paged_core import LLM
from paged_core.quantization import int4_linear, int8_linear
from paged_core.quantization.int4_linear import int4_columns
from paged_core.quantization.quantized_linear import column_groups

from ..reference import assert_close_with_cached_prefix, hf_greedy_top_logprobs, passage_token_ids
from .test_quantized_linears import LINEARS, WEIGHTS

# 8-bit: one scale per output (groups = the width), groups of 32 and 16, zeros (levels 0..31,
# and the whole range), levels within -64..63; 4-bit (always with zeros): groups of 16, 32,
# 64 and one per output
KINDS = [("int8", 256), ("int8", 32), ("int8", 16), ("int8-zeros", 32), ("int8-wide-zeros", 256),
         ("int8-narrow", 64), ("int4", 16), ("int4", 32), ("int4", 64), ("int4", 256)]


def columns_linear(cpu_isa, kind, group_size, gen, out=96):
    """A random ``[out, 256]`` weight of ``kind`` and its bfloat16 linear, which must keep its
    levels in column groups at the avx2 and avx512 levels (the test skips at the others)."""
    weight = WEIGHTS[kind](out, 256, group_size, gen)
    layer = LINEARS[kind](weight, False, torch.bfloat16)
    kept = cpu_isa in ("avx2", "avx512")
    columns = (out // 32, 256, 16 if kind == "int4" else 32)
    assert (layer.levels.shape == columns) == kept
    if not kept:
        pytest.skip(f"column groups for float32 FMAs are the avx2 and avx512 levels' layout for "
                    f"bfloat16 linears; this run is {cpu_isa}")
    return weight, layer


def dense_rows_of(kind, cpu_isa, weight, group_size):
    """Where a linear of ``kind`` at ``cpu_isa`` takes the many-rows path."""
    if kind == "int4":
        return int4_linear.COLUMNS_DENSE_ROWS[cpu_isa]
    scheme = "channel" if group_size == 256 and weight.zeros is None else "group"
    return int8_linear.COLUMNS_DENSE_ROWS[cpu_isa, scheme]


def test_the_layout_is_column_groups_of_the_levels_and_factors():
    q = torch.arange(64 * 6, dtype=torch.int32).view(64, 6)
    columns = column_groups(q)
    assert columns.shape == (2, 6, 32)
    assert all(columns[n // 32, k, n % 32] == q[n, k] for n in range(64) for k in range(6))


def test_4_bit_levels_go_two_to_a_byte_low_nibble_first():
    q = torch.randint(0, 16, (64, 6), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    columns = int4_columns(q)
    assert columns.shape == (2, 6, 16) and columns.dtype is torch.uint8
    assert all(columns[n // 32, k, n % 16] >> (4 * (n % 32 // 16)) & 15 == q[n, k]
               for n in range(64) for k in range(6))


@pytest.mark.parametrize("kind,group_size", KINDS)
def test_few_rows_are_the_dequantized_product_and_each_row_gets_its_bits_alone(cpu_isa, kind,
                                                                              group_size):
    """1, 2 (tiles of a whole column group), 3, 7 and 13 rows (tiles of up to 6, split
    evenly): the float64 product with the dequantized weight, each row's bits those it gets
    alone, and the dequantized weight exact."""
    gen = torch.Generator().manual_seed(group_size)
    weight, layer = columns_linear(cpu_isa, kind, group_size, gen)
    assert torch.equal(layer.dequantized_weight(), weight.dequantize())
    for rows in (1, 2, 3, 7, 13):
        x = torch.randn(rows, 256, generator=gen).bfloat16()
        assert rows < layer.dense_rows
        product = layer.product(x)
        assert product.dtype is torch.float32
        expected = F.linear(x.double(), weight.dequantize().double())
        torch.testing.assert_close(product.double(), expected, atol=1e-4, rtol=1e-4)
        for row in range(rows):
            assert torch.equal(layer.product(x[row:row + 1]), product[row:row + 1]), (rows, row)


@pytest.mark.parametrize("kind,group_size", KINDS)
def test_many_rows_get_the_row_layouts_dense_bits(cpu_isa, kind, group_size):
    """From ``COLUMNS_DENSE_ROWS`` rows each column group is widened to the bfloat16 of its
    dequantized weight once and multiplied on bf16_dot_linear's tiles: the bits of the packed
    bfloat16 weight's linear, row by row alike."""
    gen = torch.Generator().manual_seed(7 + group_size)
    weight, layer = columns_linear(cpu_isa, kind, group_size, gen)
    assert layer.row_dense and layer.dense_rows == dense_rows_of(kind, cpu_isa, weight, group_size)
    x = torch.randn(layer.dense_rows + 5, 256, generator=gen).bfloat16()
    dense = layer.product(x)
    assert dense.dtype is torch.bfloat16
    packed = layer.kernels.pack_bf16_dot_weight(weight.dequantize().bfloat16())
    assert torch.equal(dense, layer.kernels.bf16_dot_linear(x, packed, 96, None, 0))
    layer.dense_rows = 1
    assert torch.equal(layer.product(x[3:4]), dense[3:4])


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("threads", [1, 3])
def test_the_bits_do_not_depend_on_the_threads(cpu_isa, kind, threads, torch_threads):
    gen = torch.Generator().manual_seed(threads)
    _, layer = columns_linear(cpu_isa, kind, 32, gen, out=320)
    x = torch.randn(layer.dense_rows + 1, 256, generator=gen).bfloat16()
    few, many = layer.product(x[:9]), layer.product(x)
    torch_threads(threads)
    assert torch.equal(layer.product(x[:9]), few)
    assert torch.equal(layer.product(x), many)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_outputs_that_are_not_whole_column_groups_and_float32_linears_keep_the_row_layout(cpu_isa,
                                                                                        kind):
    gen = torch.Generator().manual_seed(0)
    columns_linear(cpu_isa, kind, 32, gen)  # skips but at the avx2 and avx512 levels
    layer = LINEARS[kind](WEIGHTS[kind](70, 256, 32, gen), False, torch.bfloat16)
    assert layer.levels.dim() == 2 and layer.levels.shape[0] == 70
    assert LINEARS[kind](WEIGHTS[kind](96, 256, 32, gen), False, torch.float32).levels.dim() == 2


# scheme, compressed_tensors_checkpoint's group_size and strategy, the levels' last dimension
ENGINE_SCHEMES = {"W8A16": (None, "channel", 32), "W4A16": (64, None, 16)}


@pytest.mark.parametrize("scheme", list(ENGINE_SCHEMES))
def test_a_weight_only_engine_in_bfloat16_is_close_to_transformers(cpu_isa, scheme,
                                                                   embedded_folder, tokenizer,
                                                                   tmp_path):
    """The embedded model in llmcompressor's W8A16 (one scale per channel) or W4A16 (groups of
    64), served in bfloat16 at the avx2 and avx512 levels with every projection in column
    groups, against transformers loading the same checkpoint in bfloat16: the near-tie rule,
    prompts read again from the cache."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    from paged_core.bench.quantized_models import compressed_tensors_checkpoint

    group_size, strategy, last = ENGINE_SCHEMES[scheme]
    kind = "int4" if scheme == "W4A16" else "int8"
    columns_linear(cpu_isa, kind, 32, torch.Generator().manual_seed(0))  # avx2, avx512 only
    checkpoint, _ = compressed_tensors_checkpoint(embedded_folder, scheme, str(tmp_path),
                                                  group_size, strategy)
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    system = passage_token_ids(tokenizer, 40)
    prompts = [system + passage_token_ids(tokenizer, n, offset=50 + 9 * i)
               for i, n in enumerate([4, 30])] + [passage_token_ids(tokenizer, 7, offset=3)]
    expected = [hf_greedy_top_logprobs(reference, p, 16, 5) for p in prompts]
    llm = LLM(model=checkpoint, dtype="bfloat16", num_kv_blocks=64, enable_prefix_caching=True)
    model = llm.engine.core.executor.runner.model
    for layer in model.layers:
        for projection in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
            assert projection.levels.dim() == 3 and projection.levels.shape[-1] == last
    assert_close_with_cached_prefix(llm, prompts, expected, 16, 5)
    llm.shutdown()
