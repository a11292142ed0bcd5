"""Another paged-core source tree as a comparison system (``--paged-core-tree PATH``), for a
before/after comparison in one run.

``git worktree add /tmp/before <commit>`` checks the other version out. ``PagedCoreTree``
runs that tree's ``LLM`` in a worker process (``LlmProcess``) of this interpreter with
``PYTHONPATH=PATH``, so its ``paged_core`` package is imported, not this one (the
``kernels`` and ``adapters`` subpackages, mapped in by the install, still come from the
install: the CPU engine never needs them). Its C++ kernels build into their own
``TORCH_EXTENSIONS_DIR`` subfolder, since the same op names built from different sources
must not share a build folder. Same engine settings as the in-process ``paged-core``
system; named ``paged-core@<commit>`` (the tree's short ``HEAD``, else its folder name).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .llm_process import LlmProcess


def tree_label(tree: Path) -> str:
    """The tree's short commit hash, or its folder name outside git."""
    proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else tree.name


class PagedCoreTree(LlmProcess):
    def __init__(self, tree: str, dtype: str, threads: int, kv_cache_memory: int,
                 engine_args: dict[str, Any] | None = None) -> None:
        """``engine_args``: the in-process system's other ``LLM`` settings (``max_num_seqs``),
        so that both engines run the same batches."""
        path = Path(tree).resolve()
        if not (path / "paged_core" / "__init__.py").is_file():
            raise SystemExit(f"--paged-core-tree {tree}: no paged_core package in that folder")
        label = tree_label(path)
        builds = Path(os.environ.get("TORCH_EXTENSIONS_DIR")
                      or Path.home() / ".cache" / "torch_extensions") / f"paged-core-tree-{label}"
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(builds),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")])))
        super().__init__(f"paged-core@{label}", sys.executable, "paged_core", dtype, threads,
                         {"kv_cache_memory": kv_cache_memory, **(engine_args or {})}, env,
                         version_key="paged_core_version")
