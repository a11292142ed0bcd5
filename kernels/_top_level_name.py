"""Why a checkout may import this package as ``kernels``, and what to do then.

The wheel installs this folder as ``paged_core.kernels`` and nothing else, and paged-core
imports it only by that name. A checkout is different: with its root on ``sys.path``
(pytest puts it there for the ``tests`` package; so does ``python -m`` run from the root)
this folder is also importable as the top-level ``kernels``, which is the import name of
Hugging Face's kernel hub package. transformers >= 5.25 requires that package and imports
it at load (``from kernels import CUDAProperties, ...``): finding this folder instead, every
model load in the checkout failed with ``ImportError: cannot import name 'CUDAProperties'
from 'kernels'``.

So a top-level import of this folder always means the other package: where it is
installed, ``hand_over_to_installed_kernels`` loads it under that name in its place.
"""
from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "kernels"  # Hugging Face's kernel hub, whose import name is ``kernels`` too


def installed_kernels_init() -> Path | None:
    """The ``__init__.py`` of the installed ``kernels`` distribution, or None if it is not
    installed (or has no such file)."""
    try:
        init = Path(metadata.distribution(DISTRIBUTION).locate_file("kernels/__init__.py"))
    except metadata.PackageNotFoundError:
        return None
    return init if init.is_file() else None


def hand_over_to_installed_kernels(name: str) -> bool:
    """For this package's ``__init__`` under ``name``: if that is the top-level ``kernels``
    and the distribution is installed, import it as ``sys.modules["kernels"]`` (replacing
    this package, whose own import then returns it) and return True; else False, and this
    package loads as itself (as ``paged_core.kernels``, always)."""
    init = installed_kernels_init() if name == "kernels" else None
    if init is None or init.resolve() == Path(__file__).with_name("__init__.py").resolve():
        return False
    spec = importlib.util.spec_from_file_location(
        "kernels", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["kernels"]
        raise
    sys.modules.pop(__name__, None)  # this module is no submodule of the package now named so
    return True
