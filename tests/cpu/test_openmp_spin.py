"""Importing paged_core before torch bounds OpenMP's idle spin (GOMP_SPINCOUNT) for this process
and the ones it starts; a user's own value wins; after torch is loaded nothing is changed."""
import os
import subprocess
import sys

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
