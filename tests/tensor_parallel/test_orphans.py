"""Workers never outlive their parent, even one killed with SIGKILL (no clean-up runs)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from ..tiny_models import build_tiny_model

pytestmark = pytest.mark.extended

SCRIPT = textwrap.dedent("""
    import sys, time
    from paged_core import LLM
    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], dtype="float32", num_kv_blocks=16, tensor_parallel_size=4)
        print(*llm.engine.core.executor.worker_pids, flush=True)
        time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_workers_exit_when_the_engine_process_is_killed(tokenizer, tmp_path):
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    script = tmp_path / "engine.py"
    script.write_text(SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), folder], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in pids), "orphaned tensor-parallel workers"
    finally:  # the engine's session holds its workers too
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
