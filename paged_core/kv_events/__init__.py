"""KV-cache events for routers, in vLLM's wire format (``kv_events_config``)."""
from .config import KVEventsConfig

__all__ = ["KVEventsConfig"]
