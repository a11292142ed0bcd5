"""release_openmp_team ends the calling thread's libgomp worker team, and AsyncEngine's
constructor ends its caller's before the loop's thread steps the engine (a second team would
make libgomp stop spinning between ops). The team checks run in a fresh process: its OS
threads are counted from /proc/self/task, with nothing else starting or ending threads
meanwhile."""
import json
import os
import subprocess
import sys
import threading

import pytest

from paged_core import EngineConfig
from paged_core.cpu.openmp_team import release_openmp_team

# A parallel op on a new thread gives that thread a team; the script prints the process's
# threads with the team, whether release_openmp_team ended it (None: not called), and the
# threads once the workers are gone (waiting up to {wait} s).
PROBE = """
import json, os, threading, time
import paged_core, torch
from paged_core.cpu.openmp_team import release_openmp_team
def threads():
    return len(os.listdir("/proc/self/task"))
result = {{}}
def on_a_thread():
    torch.ones(1 << 24).sum()
    result["with_team"] = threads()
    result["released"] = release_openmp_team() if {release} else None
    deadline = time.monotonic() + {wait}
    while threads() >= result["with_team"] and time.monotonic() < deadline:
        time.sleep(0.01)
    result["after"] = threads()
worker = threading.Thread(target=on_a_thread)
worker.start()
worker.join()
print(json.dumps(result))
"""


def _probe(release: bool, wait: float) -> dict:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU here: OpenMP makes no worker team to end")
    script = PROBE.format(release=release, wait=wait)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_release_ends_the_calling_threads_team():
    result = _probe(release=True, wait=5)
    if not result["released"]:
        pytest.skip("torch's OpenMP here is not libgomp with omp_pause_resource_all")
    assert result["after"] < result["with_team"]


def test_without_it_the_team_stays():
    result = _probe(release=False, wait=1)
    assert result["after"] == result["with_team"]


def test_async_engine_ends_its_callers_team(monkeypatch):
    """The constructor loads the model (parallel ops: a team on the calling thread) and ends
    that team on the calling thread, once, before the loop's thread steps the engine."""
    import paged_core.async_engine as async_engine

    calls = []

    def spy() -> bool:
        calls.append(threading.current_thread())
        return release_openmp_team()

    monkeypatch.setattr(async_engine, "release_openmp_team", spy)
    engine = async_engine.AsyncEngine(EngineConfig(dtype="float32", num_kv_blocks=64))
    try:
        assert calls == [threading.current_thread()]
    finally:
        engine.shutdown_sync()
