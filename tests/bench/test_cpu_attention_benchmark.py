"""``benchmarks/cpu_attention.py --quick`` compares both CPU attention paths and writes sane results."""
import importlib.util
import json
from pathlib import Path

import pytest

from paged_core.cpu.extension import cpu_extension_available

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_attention.py"


@pytest.mark.skipif(not cpu_extension_available(), reason="the C++ CPU kernels could not be built here")
def test_quick_run_writes_json_and_png(tmp_path):
    spec = importlib.util.spec_from_file_location("cpu_attention_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--quick", "--reps", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "cpu_attention.json").read_text())
    assert (tmp_path / "cpu_attention.png").stat().st_size > 0
    assert {"cpu", "threads", "torch"} <= set(result["machine"])
    assert {r["kind"] for r in result["rows"]} == {"decode", "prefill"}
    for row in result["rows"]:
        assert 0 < row["kernel_us"]["best"] <= row["kernel_us"]["median"]
        assert 0 < row["torch_us"]["best"] <= row["torch_us"]["median"]
        assert row["max_abs_diff"] < 0.05  # both paths compute the same attention (bf16)
