"""``paged-core bench attention``: its inputs are what it claims, and ``--quick`` writes sane
results (structure and arithmetic, never speed) only inside ``--out``."""
import dataclasses
import json
import math
import statistics

import pytest
import torch

from paged_core.bench.attention_cases import SMOLLM2, kv_pool, paged_step
from paged_core.bench.cli import main
from paged_core.bench.machine_rates import linear_kind
from paged_core.cpu.extension import cpu_extension_available
from paged_core.cpu.isa import selected_bf16_linear, selected_cpu_isa, supported_cpu_isas
from paged_core.kernels import reference


def test_table_copies_use_distinct_pool_blocks():
    """Every call of a step reads blocks that the other copies never hold."""
    generator = torch.Generator().manual_seed(0)
    pool = kv_pool(SMOLLM2, torch.bfloat16, num_blocks=50, generator=generator)
    step = paged_step(pool, batch=2, seq_len=40, query_len=1, generator=generator)
    assert step.instances == 50 // (2 * 3)
    blocks = step.tables[:, :, :3].flatten().tolist()  # 40 tokens: 3 blocks per sequence
    assert len(set(blocks)) == len(blocks) and 0 <= min(blocks) and max(blocks) < 50
    with pytest.raises(ValueError, match="need 55 blocks"):
        paged_step(pool, batch=5, seq_len=161, query_len=1, generator=generator)
    one = paged_step(pool, batch=2, seq_len=40, query_len=40, generator=generator, copies=1)
    assert one.instances == 1 and one.tables.shape == (1, 2, 3)
    assert paged_step(pool, batch=2, seq_len=40, query_len=1, generator=generator,
                      copies=100).instances == 50 // (2 * 3)  # no more than the pool holds


@pytest.mark.skipif(not cpu_extension_available(), reason="the C++ CPU kernels could not be built here")
@pytest.mark.parametrize("query_len", [1, 40], ids=["decode", "prefill"])
def test_step_attends_over_its_next_table_copy(query_len):
    """A call is the attention of the step's queries over the blocks of the next copy."""
    generator = torch.Generator().manual_seed(1)
    pool = kv_pool(SMOLLM2, torch.float32, num_blocks=20, generator=generator)
    step = paged_step(pool, batch=2, seq_len=40, query_len=query_len, generator=generator)
    attend = step.call(selected_cpu_isa())
    for copy in range(step.instances + 1):  # the last call wraps around to copy 0
        expected = reference.paged_attention(
            step.query, pool.k.permute(1, 2, 0, 3), pool.v.permute(1, 2, 0, 3),
            step.tables[copy % step.instances], step.seq_lens, step.query_start_loc,
            SMOLLM2.head_dim ** -0.5)
        torch.testing.assert_close(attend(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not cpu_extension_available(), reason="the C++ CPU kernels could not be built here")
def test_consecutive_tables_give_each_sequence_one_run_of_distinct_blocks():
    """The ``consecutive`` layout: a sequence's blocks follow one another in the pool, and
    still no two sequences of any copy share a block."""
    generator = torch.Generator().manual_seed(3)
    pool = kv_pool(SMOLLM2, torch.bfloat16, num_blocks=50, generator=generator)
    step = paged_step(pool, batch=2, seq_len=40, query_len=1, generator=generator,
                      layout="consecutive")
    assert step.tables.shape == (50 // 6, 2, 3)
    for row in step.tables.view(-1, 3).tolist():
        assert row == list(range(row[0], row[0] + 3))
    blocks = step.tables.flatten().tolist()
    assert len(set(blocks)) == len(blocks) and max(blocks) < 50
    with pytest.raises(ValueError, match="layout must be one of scattered, consecutive"):
        paged_step(pool, batch=2, seq_len=40, query_len=1, generator=generator, layout="x")


def test_block_size_sets_the_blocks_every_case_reads(tmp_path):
    """``--block-size 64``: the shapes, settings and every step's tables are in 64-token
    blocks (a 40-token context is one block), and a call still attends over them exactly."""
    assert main(["attention", "--quick", "--block-size", "64", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "results" / "attention.json").read_text())
    assert run["settings"]["block_size"] == 64
    assert run["shapes"] == {SMOLLM2.name: {**dataclasses.asdict(SMOLLM2), "block_size": 64}}
    assert "in blocks of 64" in (tmp_path / "README.md").read_text()
    shape = dataclasses.replace(SMOLLM2, block_size=64)
    generator = torch.Generator().manual_seed(2)
    pool = kv_pool(shape, torch.float32, num_blocks=6, generator=generator)
    step = paged_step(pool, batch=2, seq_len=40, query_len=1, generator=generator)
    assert pool.k.shape == (3, 6, 64, 64) and step.tables.shape == (3, 2, 1)
    expected = reference.paged_attention(
        step.query, pool.k.permute(1, 2, 0, 3), pool.v.permute(1, 2, 0, 3), step.tables[0],
        step.seq_lens, step.query_start_loc, SMOLLM2.head_dim ** -0.5)
    torch.testing.assert_close(step.call(selected_cpu_isa())(), expected, atol=1e-5, rtol=1e-5)


def test_linear_kind_follows_the_engine():
    assert linear_kind(torch.float32, "avx512_bf16") == "F.linear"
    assert linear_kind(torch.bfloat16, "generic") == "F.linear"
    if torch.backends.mkldnn.is_available():
        assert linear_kind(torch.float16, "avx2") == "packed float32"
        dot = cpu_extension_available("avx2") and selected_bf16_linear() != "onednn"
        assert linear_kind(torch.bfloat16, "avx2") == ("bf16_dot (avx2)" if dot
                                                       else "packed float32")
        native = ("avx512_bf16" in supported_cpu_isas()  # else oneDNN's bfloat16 linear
                  and selected_bf16_linear() != "onednn")  # (auto: amx on AMX CPUs)
        expected = selected_bf16_linear() if native else "packed bfloat16"
        assert linear_kind(torch.bfloat16, "avx512_bf16") == expected


def test_each_level_of_paged_cores_linear_is_timed_as_its_own_kind():
    """The avx2 level widens bfloat16 weights to float32 where the avx512_bf16 level multiplies
    them in bfloat16: one name for both made the avx512_bf16 prefill rows of a CPU without AMX
    report the avx2 linear's rate (about half its own) beside their attention."""
    kinds = {level: linear_kind(torch.bfloat16, level) for level in ("avx2", "avx512",
                                                                     "avx512_bf16")}
    ours = {level: kind for level, kind in kinds.items() if "bf16_dot" in kind}
    assert len(set(ours.values())) == len(ours), kinds


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("attention")
    assert main(["attention", "--quick", "--out", str(base / "run")]) == 0
    written = {p.relative_to(base).as_posix() for p in base.rglob("*")}
    assert written == {"run", "run/README.md", "run/results", "run/results/attention.json",
                       "run/results/attention.png"}
    assert "## attention" in (base / "run" / "README.md").read_text()
    return json.loads((base / "run" / "results" / "attention.json").read_text())


def test_every_supported_level_but_generic_is_timed(quick_run):
    supported = supported_cpu_isas()
    expected = list(supported[1:] or supported)  # generic only with --full, unless it is alone
    assert quick_run["levels"] + list(quick_run["unavailable_levels"]) == expected
    if all(cpu_extension_available(level) for level in expected):
        assert quick_run["levels"] == expected
    assert quick_run["machine"]["paged_core_cpu_isa"] in supported


def test_bfloat16_tiles_are_also_timed_on_amx_where_the_cpu_has_it(quick_run):
    from paged_core.cpu.extension import cpu_ops
    from paged_core.cpu.isa import has_amx_bf16

    amx = ("avx512_bf16" in quick_run["levels"] and has_amx_bf16()
           and cpu_ops("avx512_bf16").bf16_amx_ready())
    assert quick_run["paths"] == quick_run["levels"] + (["avx512_bf16+amx"] if amx else [])


def _paths(run, dtype):
    """The paths a run times for ``dtype``: the AMX one for bfloat16 only."""
    return run["paths"] if dtype == "bfloat16" else run["levels"]


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-9)


def _check_timing(row):
    assert row["us_median"] > 0 and len(row["us_samples"]) == 2
    assert math.isclose(statistics.median(row["us_samples"]), row["us_median"], abs_tol=0.01)


def test_decode_rows(quick_run):
    bandwidth, s = quick_run["bandwidth"], quick_run["settings"]
    assert bandwidth["read_gbs"] == max(bandwidth["before"]["read_gbs"],
                                        bandwidth["after"]["read_gbs"]) > 0
    assert bandwidth["copy_gbs"] > 0
    rows = quick_run["decode"]
    expected = {(d, blocks, b, c, p) for d in ("bfloat16", "float32")
                for blocks in ("scattered", "consecutive") for b in s["batches"]
                for c in s["contexts"] for p in _paths(quick_run, d)}
    assert {(r["dtype"], r["blocks"], r["batch"], r["context"], r["path"])
            for r in rows} == expected
    assert len(rows) == len(expected)
    for r in rows:
        _check_timing(r)
        itemsize = 2 if r["dtype"] == "bfloat16" else 4
        assert r["kv_bytes"] == 2 * r["batch"] * r["context"] * 3 * 64 * itemsize
        assert r["table_copies"] >= 1
        assert _close(r["gbs"], r["kv_bytes"] / (r["us_median"] * 1e-6) / 1e9)
        assert _close(r["fraction_of_bandwidth"], r["gbs"] / bandwidth["read_gbs"])


def test_prefill_rows(quick_run):
    s = quick_run["settings"]
    rows = quick_run["prefill"]
    assert {(r["dtype"], r["batch"], r["prompt"], r["path"]) for r in rows} == {
        (d, b, t, p) for d in ("bfloat16", "float32") for b in s["prefill_batches"]
        for t in s["prompts"] for p in [*_paths(quick_run, d), "torch_sdpa"]}
    for r in rows:
        _check_timing(r)
        t = r["prompt"]
        assert r["table_copies"] == 1  # K and V as the layer just wrote them: in cache
        assert r["flops"] == r["batch"] * 4 * (t * (t + 1) // 2) * 64 * 9
        assert _close(r["gflops"], r["flops"] / (r["us_median"] * 1e-6) / 1e9)
        if r["path"] == "torch_sdpa":
            assert "linear" not in r
            continue
        level = r["path"].removesuffix("+amx")  # the AMX path's linears are its level's
        assert r["linear"] == linear_kind(getattr(torch, r["dtype"]), level)
        assert r["linear_flops"] == 2 * r["batch"] * t * sum(i * o for i, o in SMOLLM2.projections())
        assert r["linear_gflops"] > 0
        assert _close(r["linear_over_attention"], r["linear_gflops"] / r["gflops"])
