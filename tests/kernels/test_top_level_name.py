"""A checkout's ``kernels/`` folder imported as the top-level ``kernels`` (its root on
``sys.path``, as pytest and ``python -m`` from the root put it) hands over to Hugging Face's
``kernels`` distribution where that is installed: transformers >= 5.25 imports it at load,
and finding this folder instead failed every model load in a fresh checkout. The tests run
real interpreters with the checkout's root first on ``sys.path`` and a stand-in
distribution (``kernels`` package + dist-info, as pip lays them out) after it."""
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def stand_in_distribution(site: Path) -> Path:
    """A ``kernels`` 0.19.1 distribution in ``site``, whose package has the names
    transformers imports and a mark of its own."""
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text(textwrap.dedent("""
        MARK = "hub"
        class CUDAProperties: ...
        class Device: ...
    """))
    (site / "kernels" / "layer.py").write_text("NAME = 'hub layer'\n")
    info = site / "kernels-0.19.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.19.1\n")
    (info / "RECORD").write_text("")
    return site


def run_python(code: str, *path: Path) -> subprocess.CompletedProcess:
    # the given folders first, then whatever PYTHONPATH already held (where a machine's
    # packages live there, the interpreter still needs them)
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, path), *inherited]),
               TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=path[0], timeout=300)


def test_the_top_level_name_is_the_installed_distribution(tmp_path):
    site = stand_in_distribution(tmp_path / "site")
    proc = run_python(textwrap.dedent("""
        import sys
        import kernels
        from kernels import CUDAProperties, Device
        from kernels.layer import NAME
        import paged_core.kernels as ours
        print(kernels.MARK, NAME, callable(ours.paged_attention),
              sys.modules["kernels"] is kernels, "kernels._top_level_name" in sys.modules)
    """), REPO_ROOT, site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hub", "hub", "layer", "True", "True", "False"]


def test_paged_cores_own_name_never_hands_over(tmp_path):
    site = stand_in_distribution(tmp_path / "site")
    proc = run_python("import paged_core.kernels as k, sys; "
                      "print(k.__name__, callable(k.paged_attention), 'kernels' in sys.modules)",
                      REPO_ROOT, site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["paged_core.kernels", "True", "False"]


def test_without_the_distribution_the_folder_loads_as_itself(monkeypatch):
    from paged_core.kernels import _top_level_name

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_top_level_name.metadata, "distribution", not_installed)
    assert _top_level_name.installed_kernels_init() is None
    assert _top_level_name.hand_over_to_installed_kernels("kernels") is False
