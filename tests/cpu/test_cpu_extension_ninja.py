"""The C++ kernels are built by the ``ninja`` of the ``ninja`` wheel, whatever PATH finds first.

Two ninja versions keep build logs the other cannot read, so processes of one install that
ran different ninjas (a system ninja first on PATH in one, the venv's bin first in another,
as the Triton launcher sets it) rebuilt every kernel whenever the other had built last.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from paged_core.cpu import extension

ninja = pytest.importorskip("ninja", reason="the ninja wheel is a dependency of paged-core")


def _fake_ninja(folder: Path) -> Path:
    fake = folder / "ninja"
    fake.write_text("#!/bin/sh\necho 1.0.0\n")
    fake.chmod(0o755)
    return fake


def test_the_wheels_ninja_comes_first_while_building_and_path_is_restored(tmp_path, monkeypatch):
    _fake_ninja(tmp_path)
    before = os.pathsep.join([str(tmp_path), os.environ.get("PATH", "")])
    monkeypatch.setenv("PATH", before)
    assert shutil.which("ninja") == str(tmp_path / "ninja")
    with extension._wheel_ninja_first_on_path():
        assert Path(shutil.which("ninja")).parent == Path(ninja.BIN_DIR)
    assert os.environ["PATH"] == before


def test_path_is_restored_when_the_build_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError), extension._wheel_ninja_first_on_path():
        raise RuntimeError("the build failed")
    assert os.environ["PATH"] == str(tmp_path)
