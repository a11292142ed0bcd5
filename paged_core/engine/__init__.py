"""The engine: ``LLMEngine`` (``llm_engine``: the front end and the core in one process)
and the ``EngineCore`` (``engine_core``: schedule, execute, update); what crosses between
them is in ``requests.engine_io`` (``EngineRequest`` in, ``EngineCoreOutput`` out)."""
from .llm_engine import LLMEngine

__all__ = ["LLMEngine"]
