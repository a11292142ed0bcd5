"""``start_worker``: start a local worker rank (``MultiprocExecutor``'s ranks 1 .. size-1) as a
fresh interpreter.

Not ``multiprocessing``: its ``spawn`` children re-run the user's ``__main__``
module, so a script without an ``if __name__ == "__main__":`` guard builds a
second engine in every worker and the group never forms. A worker here is
``python -m paged_core.executor.worker_process``, which never imports the
user's main module: tensor parallelism works the same from a guarded or
unguarded script, ``python -c``, a notebook or an interactive session.

Invariants of a started worker:

- it reads the arguments of ``worker_main`` pickled on a pipe of its own (its
  stdin; never the parent's stdin, which may hold the rest of the user's code).
  The pickle names nothing defined in ``__main__``, which the worker could not
  import: such an argument is refused before the process starts;
- its ``sys.path`` is the parent's (``PYTHONPATH``; from Python 3.11 ``-P``
  also keeps the working directory from going first), so it imports the same
  ``paged_core`` even from a source folder the parent put on ``sys.path`` itself;
- it shares the parent's working directory, other environment variables,
  stdout and stderr (its log lines and tracebacks appear in the parent's log)
  and process group.
"""
from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

from .rank_worker import RankSpec

_WORKER_MODULE = "paged_core.executor.worker_process"
_SAFE_PATH = ["-P"] if sys.version_info >= (3, 11) else []  # 3.10: the working directory first


def start_worker(spec: RankSpec, rank: int, size: int, init_method: str) -> subprocess.Popen:
    """Start rank ``rank`` of ``size``, which joins the group at ``init_method`` and watches this
    process; returns at once (the caller watches the process and reaps it)."""
    payload = _dumps((spec, rank, size, init_method, os.getpid()))
    env = dict(os.environ, PYTHONPATH=_parent_path())
    process = subprocess.Popen([sys.executable, *_SAFE_PATH, "-m", _WORKER_MODULE],
                               stdin=subprocess.PIPE, env=env)
    try:
        with process.stdin:
            process.stdin.write(payload)
    except BrokenPipeError:  # it died before reading: the caller sees its exit like any other
        pass
    return process


def _parent_path() -> str:
    """This process's ``sys.path`` as a ``PYTHONPATH`` (absolute: ``''`` is the working
    directory)."""
    return os.pathsep.join(os.path.abspath(p) for p in sys.path if isinstance(p, str))


class _ImportablePickler(pickle.Pickler):
    """Refuses any object, class or function defined in ``__main__``."""

    def reducer_override(self, obj):
        if getattr(obj, "__module__", None) == "__main__":
            name = getattr(obj, "__qualname__", type(obj).__qualname__)  # class, function, instance
            raise pickle.PicklingError(
                f"__main__.{name} is sent to the tensor-parallel workers, which do not import "
                f"__main__ (they start as fresh interpreters); define it in an importable module")
        return NotImplemented


def _dumps(args: tuple) -> bytes:
    buffer = io.BytesIO()
    _ImportablePickler(buffer, pickle.HIGHEST_PROTOCOL).dump(args)
    return buffer.getvalue()
