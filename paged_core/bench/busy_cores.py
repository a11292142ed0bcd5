"""Processes that keep cores busy beside a timed scenario (``bench serve --busy-cores N``).

A serving engine often shares its machine: other models' workers, a build, a batch job. Each
of the ``N`` processes here is a fresh Python interpreter spinning in a loop, so it keeps
one core busy for as long as the scenario runs (and asks for nothing else: no memory
traffic, no system calls). They start after the quiet wait and stop (SIGKILL, by PID) when
the scenario ends; ``ForeignLoad`` counts their ticks as another process's, not as the
command's own, so the summary marks the scenario as loaded and says how busy they kept the
cores.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

SPIN = "while True:\n    pass\n"


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[list[int]]:
    """Run ``count`` busy loops while the body runs; yields their PIDs."""
    if count < 0:
        raise ValueError(f"busy cores must be >= 0, got {count}")
    spinners: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            spinners.append(subprocess.Popen([sys.executable, "-c", SPIN],
                                              stdin=subprocess.DEVNULL))
        yield [spinner.pid for spinner in spinners]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
