"""``bench throughput`` records the machine's memory read rate before each repeat and after the
last (``machine_rates.read_bandwidth``), so that a result says which of its runs shared a memory
speed; its README section and printed summary show the rates, and results written before the
field existed still render."""
from paged_core.bench import throughput
from paged_core.bench.machine_rates import PROBE_BYTES, read_bandwidth


def _result(**extra):
    system = {"median_output_tok_s": 40.0, "median_total_tok_s": 90.0, "median_seconds": 2.0,
              "runs": [{"output_tok_s": 39.0}, {"output_tok_s": 41.0}]}
    return {"workload": {"num_requests": 4, "prompt_tokens": 100, "output_tokens": 80},
            "dtype": "bfloat16", "repeats": 2, "concurrency": None, "max_num_seqs": None,
            "systems": {"paged-core": system}, "llama_cpp": {}, "notes": [], **extra}


def test_the_probe_reads_this_machine_now():
    assert PROBE_BYTES >= 1 << 30  # far past any CPU cache
    assert read_bandwidth() > 0.1  # GB/s: every machine reads faster than that


def test_the_rates_show_in_the_readme_and_the_summary(capsys):
    result = _result(memory_read_gbs=[31.25, 27.96, 30.04])
    rows = dict(throughput.readme_rows(result))
    (label,) = [k for k in rows if k.startswith("memory read GB/s")]
    assert "1024 MiB" in label and "before each repeat, then after the last" in label
    assert rows[label] == "31.2, 28.0, 30.0"
    throughput.print_summary(result)
    assert "memory read GB/s before each repeat, then after the last: 31.2, 28.0, 30.0" in (
        capsys.readouterr().out)


def test_results_from_before_the_rates_render_without_them(capsys):
    result = _result()
    assert not [k for k, _ in throughput.readme_rows(result) if k.startswith("memory read")]
    throughput.print_summary(result)
    assert "memory read" not in capsys.readouterr().out
