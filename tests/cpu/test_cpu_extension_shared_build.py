"""Every copy of the same C++ sources on one torch install shares one build: another clone
run by the same venv compiles nothing.

The kernels compile from a copy of the sources inside the build folder
(``paged_core.cpu.extension._sync_sources``), so the build does not depend on where the
package lives; the copy is rewritten only where the package's sources differ, which is
what tells ninja to recompile.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import paged_core
from paged_core.cpu import extension
from paged_core.cpu.isa import selected_cpu_isa


@pytest.fixture
def package_sources(tmp_path, monkeypatch) -> Path:
    """A stand-in for the package's C++ folder, two sources and a header."""
    csrc = tmp_path / "package_csrc"
    csrc.mkdir()
    (csrc / "a.cpp").write_text("int a() { return 1; }\n")
    (csrc / "b.cpp").write_text("int b() { return 2; }\n")
    (csrc / "c.h").write_text("#pragma once\n")
    monkeypatch.setattr(extension, "_CSRC", csrc)
    return csrc


def _set_old_times(folder: Path) -> None:
    for file in folder.iterdir():
        os.utime(file, ns=(1_000_000_000, 1_000_000_000))


def test_sources_are_copied_into_the_build_folder(tmp_path, package_sources):
    build = tmp_path / "build"
    build.mkdir()
    copy = extension._sync_sources(build)
    assert copy == build / "csrc"
    assert sorted(p.name for p in copy.iterdir()) == ["a.cpp", "b.cpp", "c.h"]
    assert (copy / "b.cpp").read_text() == "int b() { return 2; }\n"


def test_only_changed_sources_are_rewritten_and_removed_ones_go(tmp_path, package_sources):
    build = tmp_path / "build"
    build.mkdir()
    copy = extension._sync_sources(build)
    _set_old_times(copy)
    (package_sources / "b.cpp").write_text("int b() { return 3; }\n")
    (package_sources / "c.h").unlink()

    extension._sync_sources(build)

    assert sorted(p.name for p in copy.iterdir()) == ["a.cpp", "b.cpp"]
    assert (copy / "a.cpp").stat().st_mtime_ns == 1_000_000_000, "an unchanged source was rewritten"
    assert (copy / "b.cpp").stat().st_mtime_ns > 1_000_000_000, "a changed source kept its old time"
    assert (copy / "b.cpp").read_text() == "int b() { return 3; }\n"


def test_the_build_folder_depends_on_the_torch_install_not_on_where_the_package_is(
        package_sources, tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))  # folders made here
    folder = extension.build_directory("generic")
    version = torch.__version__.replace("+", "_")
    assert folder.name.startswith(f"paged_core_cpu_generic-torch{version}-")
    assert str(package_sources) not in str(folder)
    monkeypatch.setattr(torch, "__file__", "/another/venv/site-packages/torch/__init__.py")
    assert extension.build_directory("generic") != folder, "two torch installs share a folder"


def test_only_the_levels_with_code_in_a_source_compile_it():
    assert set(extension._BF16_LEVEL_SOURCES) <= set(extension._sources("avx512_bf16"))
    for level in ("generic", "avx2", "avx512"):
        assert not set(extension._BF16_LEVEL_SOURCES) & set(extension._sources(level))
    for source in extension._BF16_LEVEL_SOURCES:
        assert "#if defined(__AVX512BF16__)" in (extension._CSRC / source).read_text(), source
    for level in ("avx2", "avx512", "avx512_bf16"):
        assert set(extension._VECTOR_LEVEL_SOURCES) <= set(extension._sources(level))
    assert not set(extension._VECTOR_LEVEL_SOURCES) & set(extension._sources("generic"))
    for source in extension._VECTOR_LEVEL_SOURCES:
        assert "#if PAGED_CORE_BF16_DOT" in (extension._CSRC / source).read_text(), source


@pytest.mark.skipif(not extension.cpu_extension_available(),
                    reason="the C++ kernels do not build here")
def test_a_copy_of_the_package_elsewhere_loads_the_built_kernels_without_compiling(tmp_path):
    """Another clone run by this venv (here: the package copied to another folder) finds the
    build done."""
    clone = tmp_path / "clone"
    shutil.copytree(Path(paged_core.__file__).parent, clone / "paged_core",
                    ignore=shutil.ignore_patterns("__pycache__"))
    level = selected_cpu_isa()
    library = extension.build_directory(level) / f"{extension.ops_namespace(level)}.so"
    assert library.is_file()
    before = library.stat().st_mtime_ns
    probe = ("import sys, paged_core.cpu.extension as e; "
             "print(e.__file__); sys.exit(e.cpu_extension_error() or 0)")
    env = dict(os.environ, PYTHONPATH=str(clone))
    done = subprocess.run([sys.executable, "-c", probe], env=env, timeout=300, cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith(str(clone)), "the probe imported the original package"
    assert library.stat().st_mtime_ns == before, "the clone rebuilt the kernels"
