"""``bench serve --busy-cores N``: busy loops in processes of their own beside every scenario,
counted as other processes' load (``paged_core.bench.busy_cores``, ``foreign_load``)."""
import json
import os
import sys
import time

import pytest

from paged_core.bench.busy_cores import busy_cores
from paged_core.bench.cli import main
from paged_core.bench.foreign_load import ForeignLoad

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_each_loop_keeps_a_core_busy_and_is_gone_afterwards():
    hz = os.sysconf("SC_CLK_TCK")
    with busy_cores(1) as (pid,):
        time.sleep(0.2)  # the interpreter starts
        before = _ticks(pid)
        time.sleep(0.5)
        assert _ticks(pid) - before >= 0.2 * hz  # it spins (beside whatever else runs here)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="busy cores"):
        with busy_cores(-1):
            pass


def test_the_loops_count_as_other_processes_load():
    """The same window measured twice: with the loops named as others, their ticks are the
    others' share; without, they are this process tree's own."""
    cores = os.cpu_count() or 1
    with busy_cores(1) as pids:
        time.sleep(0.2)
        theirs = ForeignLoad(others=frozenset(pids))
        ours = ForeignLoad()
        time.sleep(1.0)
        with_loops = theirs.stop(max_busy=0.1)["foreign_busy"]
        without = ours.stop(max_busy=0.1)["foreign_busy"]
    assert with_loops - without >= 0.3 / cores  # most of a core over the window


def test_bench_serve_runs_every_scenario_beside_them(tmp_path):
    count = max(1, (os.cpu_count() or 1) // 4)  # >= a quarter of the cores: never "quiet"
    out = tmp_path / "run"
    assert main(["serve", "--quick", "--in-process", "--dtype", "float32", "--busy-cores",
                 str(count), "--out", str(out)]) == 0
    result = json.loads((out / "results" / "serve.json").read_text())
    assert result["busy_cores"] == count
    assert len(result["scenarios"]) >= 2
    for scenario in result["scenarios"]:
        assert scenario["completed"] == scenario["num_requests"] and scenario["failed"] == 0
        assert scenario["machine_during"]["quiet"] is False
        assert scenario["machine_during"]["foreign_busy"] >= 0.5 * count / (os.cpu_count() or 1)
    assert "busy loops beside every scenario" in (out / "README.md").read_text()
