"""Triton Inference Server adapter (Python backend, decoupled streaming).

- ``write_repository(out_dir, config, model_name="paged_llm")``: a ready model repository;
- ``python -m paged_core.adapters.triton_server --host H --port P``: write one and run
  the ``tritonserver`` bundled with ``nvidia-pytriton`` on it (``launcher.py``).
"""
from .repository import write_repository

__all__ = ["write_repository"]
