"""BentoML adapter: ``bentoml serve paged_core.adapters.bentoml.service:PagedLLM``.

The service lives in ``service.py`` (imported by BentoML, not here, so that
importing this package does not build anything).
"""
from ..launch import BENTOML_TARGET

__all__ = ["BENTOML_TARGET"]
