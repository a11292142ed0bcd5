"""Smoke tests of ``paged-core bench``: every benchmark in ``--quick`` mode writes sane results.

They check that the JSON is well formed and the numbers make sense (positive
throughputs, waste in [0, 1], cache hits only with caching on, fewer blocks
with shared parallel sampling, ~1/N of the weights and KV cache per
tensor-parallel rank), not that anything is fast. ``bench all`` runs
once for the module, with ``serve --in-process`` (no server start; the real
servers are driven by ``tests/e2e``), in float32: fast on every CPU (bfloat16 is
emulated where the CPU lacks AVX512-BF16, and took 3x as long on an AVX2 EPYC).
"""
import json

import pytest

from paged_core.bench.cli import BENCHMARKS, main

pytestmark = pytest.mark.extended  # every benchmark, minutes on 2 cores: `make test-all`
MACHINE_KEYS = {"cpu", "cores", "threads", "torch", "transformers"}


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench")
    out = base / "run"
    assert main(["all", "--quick", "--in-process", "--dtype", "float32", "--out", str(out)]) == 0
    assert list(base.iterdir()) == [out]  # every benchmark wrote inside --out only
    return out / "results"


def _load(results_dir, name):
    result = json.loads((results_dir / f"{name}.json").read_text())
    assert result["benchmark"] == name
    assert MACHINE_KEYS <= set(result["machine"])
    assert result["date"] and result["command"].startswith("paged-core bench all --quick")
    assert (results_dir / f"{name}.png").stat().st_size > 0
    return result


def test_throughput(results_dir):
    result = _load(results_dir, "throughput")
    assert result["workload"]["num_requests"] == 8
    systems = result["systems"]
    assert set(systems) == {"paged-core", "hf-static", "hf-generate_batch"}
    for entry in systems.values():
        assert entry["median_output_tok_s"] > 0 and entry["median_total_tok_s"] > 0
        assert entry["ratio_vs_naive"] > 0
        (run,) = entry["runs"]
        assert run["output_tokens"] == result["workload"]["output_tokens"]
    assert systems["hf-static"]["runs"][0]["computed_tokens"] >= result["workload"]["output_tokens"]
    assert systems["hf-static"]["ratio_vs_naive"] == 1.0
    assert any("vLLM skipped" in note for note in result["notes"])
    # the memory read rate before the one repeat, then after it
    assert len(result["memory_read_gbs"]) == 2 and min(result["memory_read_gbs"]) > 0


def test_steps(results_dir):
    """Every step of the timed pass is counted once: groups cover the steps, phases the run."""
    from paged_core.bench.step_phases import PHASES

    result = _load(results_dir, "steps")
    assert result["output_tokens"] == result["workload"]["output_tokens"]
    assert sum(g["steps"] for g in result["groups"]) == result["num_steps"] == len(result["steps"])
    assert abs(sum(result["phase_share"].values()) - 1) < 1e-9
    # Layers run as one C++ call time their attention inside forward.
    untimed = {"other"} | ({"attention"} if result["layers"].startswith("one C++ call") else set())
    assert all(result["phase_seconds"][p] > 0 for p in PHASES if p not in untimed)
    assert {g["kind"] for g in result["groups"]} == {"decode", "mixed"}
    memory = result["memory"]  # a CPU run sets its steps against memory
    assert memory["read_gbs"] == max(memory["bandwidth_before"]["read_gbs"],
                                     memory["bandwidth_after"]["read_gbs"]) > 0
    for g in result["groups"]:
        assert abs(sum(g["phase_ms"].values()) - g["mean_ms"]) < 1e-6
        assert g["mean_rows"] >= g["mean_tokens"] >= g["mean_seqs"] >= 1
        assert g["mean_context_tokens"] >= g["mean_tokens"]
        assert g["mean_bytes"] > memory["weight_bytes"] > 0
        assert g["over_bound"] == pytest.approx(g["mean_ms"] / g["bound_ms"])


def _check_serve(result):
    for scenario in result["scenarios"]:
        assert scenario["failed"] == 0 and scenario["completed"] == scenario["num_requests"]
        assert scenario["output_tok_s"] > 0
        for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert 0 < scenario[metric]["p50"] <= scenario[metric]["p99"]
        assert scenario["e2e_ms"]["p50"] >= scenario["ttft_ms"]["p50"]
        # the engine runs in the benchmark's own process: the others' share is measured
        during = scenario["machine_during"]
        assert 0 <= during["foreign_busy"] <= 1 and isinstance(during["quiet"], bool)


def test_serve_in_process(results_dir):
    result = _load(results_dir, "serve")
    assert result["target"] == "in-process AsyncEngine"
    assert [s["label"] for s in result["scenarios"]] == ["poisson 4 req/s", "burst 6"]
    _check_serve(result)


def test_memory(results_dir):
    result = _load(results_dir, "memory")
    layouts = result["layouts"]
    assert len(layouts) == 5
    for entry in layouts.values():
        assert 0 <= entry["waste"] < 1 and entry["fits"] >= 1
    assert layouts["paged (block 16)"]["waste"] < layouts["contiguous (max_model_len)"]["waste"]
    assert layouts["paged (block 16)"]["fits"] > layouts["contiguous (max_model_len)"]["fits"]


def test_prefix(results_dir):
    modes = _load(results_dir, "prefix")["modes"]
    assert modes["on"]["prefix_cache_hits"] > 0 and 0 < modes["on"]["hit_rate"] <= 1
    assert modes["off"]["prefix_cache_hits"] == 0 and modes["off"]["hit_rate"] == 0
    for mode in modes.values():
        assert all(t > 0 for t in mode["ttft_ms"])


def test_sharing(results_dir):
    rows = _load(results_dir, "sharing")["rows"]
    assert [r["n"] for r in rows] == [2, 4]
    for r in rows:
        assert 0 < r["parallel_peak_blocks"] < r["independent_peak_blocks"]
        assert 0 < r["beam_peak_blocks"] < r["independent_peak_blocks"]
        assert 0 < r["saved"] < 1 and 0 < r["beam_saved"] < 1


def test_tp(results_dir):
    """TP 2 halves a rank's weights (bar the replicated norms) and KV cache; the embedded
    model refuses TP 2 with the engine's message; only TP > 1 spends time in collectives."""
    from paged_core.executor.group import TensorParallelGroup

    result = _load(results_dir, "tp")
    assert "cannot be faster" in result["notes"][0] and "cores" in result["machine_summary"]
    embedded = result["models"]["SmolLM2-135M (embedded)"]
    assert embedded["allowed_sizes"][:2] == [1, 3]
    assert "does not divide this model's 9 attention heads" in embedded["sizes"]["2"]["refused"]
    tiny = result["models"]["random Llama 12 heads / 6 KV heads"]["sizes"]
    one, two = tiny["1"], tiny["2"]
    assert one["rank0_engine"] == one["per_rank"][0] and two["rank0_engine"] == two["per_rank"][0]
    assert two["per_rank"][0] == two["per_rank"][1]  # every rank holds the same share
    assert two["per_rank"][0]["kv_cache_bytes"] * 2 == one["per_rank"][0]["kv_cache_bytes"]
    # Half of every split weight plus the replicated norms and rotary tables, which are a few
    # percent of the tiny model whichever linears this CPU packs (float32 copies or bfloat16).
    assert 0.5 <= two["per_rank"][0]["weight_bytes"] / one["per_rank"][0]["weight_bytes"] < 0.55
    for kind in ("decode", "prefill"):
        assert one[kind]["comm_share"] < 0.01 < two[kind]["comm_share"] < 1
        assert 0 < two[kind]["comm_ms_median"] < two[kind]["step_ms_median"]
        assert len(two[kind]["step_ms"]) == result["settings"]["steps"]
    assert TensorParallelGroup.all_reduce.__name__ == "all_reduce"
    assert not hasattr(TensorParallelGroup.all_reduce, "__wrapped__")  # timers removed


def test_structured(results_dir):
    result = _load(results_dir, "structured")
    assert result["num_requests"] == result["num_schemas"] == 6
    assert result["valid_json"] == 6  # every constrained output parses
    assert result["constrained"]["tokens"] == result["unconstrained"]["tokens"] > 0
    compile_times = result["compile"]
    assert 0 < compile_times["cached_ms_median"] < compile_times["cold_ms_max"]


def test_spec(results_dir):
    result = _load(results_dir, "spec")
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"plain", "ngram"} and rows["plain"]["acceptance_rate"] is None
    for r in rows.values():
        assert r["output_tokens"] == r["num_requests"] * result["output_len"]
        assert r["output_tok_s"] > 0 and r["itl_ms"]["mean"] > 0
    assert 0 < rows["ngram"]["acceptance_rate"] <= 1 and rows["ngram"]["mean_acceptance_length"] > 1


def test_moe(results_dir):
    """One decoding sequence runs exactly its top_k experts per layer, whatever the total;
    a batch runs more, never more than the model has."""
    result = _load(results_dir, "moe")
    rows = result["rows"]
    assert {(r["experts"], r["top_k"]) for r in rows} == {(4, 2), (8, 2), (8, 1)}
    for r in rows:
        assert r["decode_step_ms"] > 0 and r["output_tok_s"] > 0 and r["decode_steps"] > 0
        if r["batch"] == 1:
            assert r["experts_run_per_layer"] == r["top_k"]
        else:
            assert r["top_k"] <= r["experts_run_per_layer"] <= r["experts"]


def test_readme_is_generated(results_dir):
    readme = (results_dir.parent / "README.md").read_text()
    assert "Generated by `paged-core bench all`" in readme
    for name in BENCHMARKS:
        assert f"## {name}" in readme and f"results/{name}.png" in readme
    assert "paged-core bench all --quick" in readme
