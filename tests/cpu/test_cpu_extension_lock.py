"""Loading the C++ kernels survives a process killed while loading them.

torch's ``load`` leaves a ``lock`` file behind when its process is killed, and
every later load of that build folder used to wait for it forever. These tests
kill real processes and check that the next load goes through.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from paged_core.cpu import extension as cpu_extension
from paged_core.cpu.extension import _build_folder_lock

HOLD_AND_HANG = """
import sys, time
from pathlib import Path
from paged_core.cpu.extension import _build_folder_lock
folder = Path(sys.argv[1])
with _build_folder_lock(folder):
    (folder / "lock").touch()  # what torch's load creates before building
    print("holding", flush=True)
    time.sleep(600)
"""


def _start_holder(folder: Path) -> subprocess.Popen:
    """A process that holds the folder lock, inside a 'load' that will never return."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    return holder


def _acquire_in_thread(folder: Path) -> tuple[threading.Thread, threading.Event]:
    acquired = threading.Event()

    def take() -> None:
        with _build_folder_lock(folder):
            acquired.set()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, acquired


def test_a_stale_torch_lock_is_removed(tmp_path):
    (tmp_path / "lock").touch()
    with _build_folder_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_live_holder_keeps_others_out_until_it_is_killed(tmp_path):
    holder = _start_holder(tmp_path)
    try:
        thread, acquired = _acquire_in_thread(tmp_path)
        assert not acquired.wait(1.0), "entered while a live process held the build folder"
        assert (tmp_path / "lock").exists(), "removed a live process's lock"
        holder.send_signal(signal.SIGKILL)
        assert acquired.wait(60), "never entered after the holder was killed"
        thread.join(60)
        assert not (tmp_path / "lock").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.skipif(not cpu_extension.cpu_extension_available(), reason="the C++ kernels do not build here")
def test_loading_after_a_killed_load_does_not_hang():
    """A fresh process loads the kernels from the build folder whose last loader was killed."""
    built = cpu_extension.build_directory()
    holder = _start_holder(built)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (built / "lock").exists()

    probe = ("from paged_core.cpu.extension import cpu_extension_error as e; "
             "import sys; sys.exit(e() or 0)")
    done = subprocess.run([sys.executable, "-c", probe], timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (built / "lock").exists()
