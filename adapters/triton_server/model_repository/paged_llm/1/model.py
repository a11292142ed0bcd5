"""Triton Python-backend entry point of ``paged_llm``; the implementation ships with paged-core.

Triton's Python stub must run an interpreter where ``paged-core`` is installed
(put the virtual environment's ``bin`` first on ``PATH``; see
``paged_core.adapters.triton_server.launcher``).
"""
from paged_core.adapters.triton_server.python_model import TritonPythonModel  # noqa: F401
