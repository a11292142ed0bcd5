"""Importing paged_core before torch bounds OpenMP's idle spin (GOMP_SPINCOUNT) for this process
and the ones it starts; a user's own value wins; after torch is loaded nothing is changed."""
import os
import subprocess
import sys

import pytest

PROBE = "import os; {imports}; print(os.environ.get('GOMP_SPINCOUNT'))"


def _spincount(imports: str, **env: str) -> str:
    child_env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    child_env.update(env)
    done = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports)], env=child_env,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_paged_core_first_sets_the_bounded_spin():
    from paged_core.cpu.openmp_spin import DEFAULT_SPINCOUNT
    assert _spincount("import paged_core") == DEFAULT_SPINCOUNT


def test_the_users_value_wins():
    assert _spincount("import paged_core", GOMP_SPINCOUNT="7") == "7"


def test_too_late_once_torch_is_loaded():
    assert _spincount("import torch; import paged_core") == "None"


REASON = ("from paged_core.cpu.openmp_spin import threads_sleep_reason; "
          "print(threads_sleep_reason() is not None)")


def _threads_sleep(imports: str, **env: str) -> bool:
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    child_env.update(env)
    done = subprocess.run([sys.executable, "-c", f"{imports}; {REASON}"], env=child_env,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip().splitlines()[-1] == "True"


def test_torch_first_under_a_passive_policy_is_named():
    assert _threads_sleep("import torch; import paged_core", OMP_WAIT_POLICY="PASSIVE")
    assert _threads_sleep("import torch; import paged_core", OMP_WAIT_POLICY="passive")


@pytest.mark.extended
def test_no_reason_where_threads_spin():
    assert not _threads_sleep("import paged_core; import torch", OMP_WAIT_POLICY="PASSIVE")
    assert not _threads_sleep("import torch; import paged_core", OMP_WAIT_POLICY="PASSIVE",
                              GOMP_SPINCOUNT="100000")
    assert not _threads_sleep("import torch; import paged_core")  # libgomp's default spins
    assert not _threads_sleep("import torch; import paged_core", OMP_WAIT_POLICY="ACTIVE")


@pytest.mark.extended
def test_a_cpu_engine_names_the_import_order(embedded_folder):
    """A user script that imports torch first, under a passive policy, builds a CPU engine:
    its log names the cause and the way out (once); paged_core first: no such line."""
    script = ("{first}; from paged_core import LLM; "
              f"LLM(model={str(embedded_folder)!r}, dtype='float32', kv_cache_memory=32 << 20)")
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    logs = {}
    for first in ("import torch", "import paged_core"):
        done = subprocess.run([sys.executable, "-c", script.format(first=first)], env=env,
                              capture_output=True, text=True, timeout=600, check=True)
        logs[first] = done.stderr
    assert logs["import torch"].count("GOMP_SPINCOUNT=100000") == 1
    assert "Import paged_core before torch" in logs["import torch"]
    assert "GOMP_SPINCOUNT" not in logs["import paged_core"]
