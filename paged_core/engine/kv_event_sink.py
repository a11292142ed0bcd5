"""The KV-event publisher an engine core hands its prefix cache's events to, if its
``kv_events_config`` asks for one (``kv_events.publisher``)."""
from __future__ import annotations

from ..config import EngineConfig


def kv_event_publisher(config: EngineConfig):
    """The publisher ``kv_events_config`` asks for (a ``ZmqEventPublisher``), else ``None``.
    Its blocks' medium is vLLM's ``"GPU"`` (the engine's own KV cache) on every device."""
    events = config.kv_events_config
    if events is None or not events.publishes:
        return None
    try:
        from ..kv_events.publisher import ZmqEventPublisher
        return ZmqEventPublisher(events)
    except ImportError as exc:
        raise ValueError(f"kv_events_config with publisher 'zmq' needs pyzmq and msgspec "
                         f"(pip install 'paged-core[kv-events]'): {exc}") from None
