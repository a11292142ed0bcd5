"""``bench serve --repeats``: every scenario runs that many times, systems in turn within each
run, and each system's summary adds the median over a scenario's runs of its rates and of each
latency percentile."""
import json
import statistics

import pytest

from paged_core.bench.cli import main
from paged_core.bench.clients import RequestRecord
from paged_core.bench.serve import _scenario, readme_rows, repeat_medians


def _run(label, ttfts, seconds):
    """A scenario whose requests got their first token after ``ttfts`` seconds and 4 tokens
    each, 10 ms apart."""
    records = [RequestRecord(prompt_tokens=8, output_tokens=4, ttft=t, e2e=t + 0.03,
                             token_times=[t, t + 0.01, t + 0.02, t + 0.03]) for t in ttfts]
    return _scenario(label, None, records, seconds)


def test_medians_are_taken_per_label_over_its_runs_only():
    runs = [_run("burst 3", [0.1, 0.2, 0.9], 1.0), _run("poisson 1 req/s", [0.05] * 3, 3.0),
            _run("burst 3", [0.1, 0.3, 0.5], 2.0), _run("burst 3", [0.2, 0.4, 2.0], 4.0)]
    (burst,) = repeat_medians(runs)  # the Poisson scenario ran once: no median for it
    assert burst["label"] == "burst 3" and burst["runs"] == 3 and burst["failed"] == 0
    bursts = [r for r in runs if r["label"] == "burst 3"]
    assert burst["output_tok_s"] == statistics.median(r["output_tok_s"] for r in bursts) == 6.0
    for metric in ("ttft_ms", "e2e_ms", "itl_ms"):
        for point in ("p50", "p99"):
            assert burst[metric][point] == pytest.approx(
                statistics.median(r[metric][point] for r in bursts))
    # the median of the runs' p99s (886 ms), not the p99 of their nine pooled requests
    assert burst["ttft_ms"]["p99"] == pytest.approx(886.0)


def test_repeated_scenarios_run_in_turn_and_report_their_medians(tmp_path):
    assert main(["serve", "--in-process", "--quick", "--dtype", "float32", "--repeats", "2",
                 "--settle-timeout", "0", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results" / "serve.json").read_text())
    assert result["repeats"] == 2
    scenarios = result["scenarios"]
    assert [(s["label"], s["run"]) for s in scenarios] == [
        ("poisson 4 req/s", 1), ("burst 6", 1), ("poisson 4 req/s", 2), ("burst 6", 2)]
    assert all(s["failed"] == 0 and s["completed"] == s["num_requests"] for s in scenarios)
    # each run sends requests of its own (no prefix cache hits on the run before's prompts)
    assert result["workload"]["num_requests"] == 12
    medians = {m["label"]: m for m in result["repeat_medians"]}
    assert set(medians) == {"poisson 4 req/s", "burst 6"}
    burst = [s for s in scenarios if s["label"] == "burst 6"]
    assert medians["burst 6"]["ttft_ms"]["p99"] == pytest.approx(
        statistics.median(s["ttft_ms"]["p99"] for s in burst))
    rows = [name for name, _ in readme_rows(result)]
    # each run's row (marked where other processes were busy meanwhile), then the medians'
    assert [name.split(":")[0].split(" (")[0] for name in rows if name.startswith("serve burst")] \
        == ["serve burst 6 #1", "serve burst 6 #2", "serve burst 6, median of 2 runs"]
