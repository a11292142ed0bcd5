"""OpenAI-compatible serving layer shared by every adapter (FastAPI routes + metrics)."""
from .app import EngineHolder, build_openai_app, install_openai_routes, openai_router
from .errors import OpenAIError
from .metrics import ServingMetrics

__all__ = ["EngineHolder", "OpenAIError", "ServingMetrics", "build_openai_app",
           "install_openai_routes", "openai_router"]
