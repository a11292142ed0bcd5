"""``KVEventsConfig``: vLLM's ``kv_events_config``, validated.

vLLM's keys and defaults: ``enable_kv_cache_events`` (False), ``publisher`` (``"null"``:
nothing is sent; ``"zmq"``; unset: ``"zmq"`` when events are enabled, else ``"null"``), ``endpoint`` (the ZMQ PUB address, ``"tcp://*:5557"``: bind
where the host is ``*``, else connect), ``replay_endpoint`` (a ROUTER address answering
"every batch since sequence number N", or ``None``), ``buffer_steps`` (batches kept for
replay, 10000), ``hwm`` (the PUB socket's high-water mark, 100000), ``max_queue_size``
(batches waiting for the publisher thread, 100000: past it a batch is dropped and counted,
never waited for), ``topic`` (the first frame of every message, ``""``). Given as a dict or
its JSON text (``PAGED_CORE_KV_EVENTS_CONFIG``, ``--kv-events-config``); every bad value
raises ``ValueError`` naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..config.setting_values import dict_setting

PUBLISHERS = ("null", "zmq")


@dataclass(frozen=True)
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in PUBLISHERS:
            raise ValueError(f"kv_events_config['publisher'] must be one of {PUBLISHERS}, got "
                             f"{self.publisher!r}")
        for key in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"kv_events_config[{key!r}] must be a positive int, got {value!r}")
        for key in ("endpoint", "replay_endpoint"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or "://" not in value):
                raise ValueError(f"kv_events_config[{key!r}] must be a ZMQ address like "
                                 f"'tcp://*:5557', got {value!r}")

    @property
    def publishes(self) -> bool:
        """True if events are collected and sent (enabled, with a real publisher)."""
        return self.enable_kv_cache_events and self.publisher != "null"

    @classmethod
    def from_value(cls, value: "KVEventsConfig | dict | str | None") -> "KVEventsConfig | None":
        """Build from a dict (or its JSON text); ``None`` (or ``{}``) means no events."""
        if value is None or isinstance(value, KVEventsConfig):
            return value
        value = dict_setting("kv_events_config", value, {f.name for f in fields(cls)})
        return None if value is None else cls(**value)
