"""``ZmqEventPublisher``: sends each step's KV-cache events the way vLLM's publisher does.

- Every batch is one multipart message on a ZMQ PUB socket: ``[topic, sequence number
  (8 bytes, big-endian, from 0, no gaps), msgpack KVEventBatch]`` (``wire``).
- With a ``replay_endpoint``, a ROUTER socket answers a request ``[b"", start sequence
  number (8 bytes big-endian)]`` (a DEALER's empty delimiter first) with every buffered batch
  from that number on, each as ``[b"", topic, sequence number, payload]`` like the live
  stream, then the end marker ``[b"", b"", -1 (8 bytes, signed), b""]``; the last
  ``buffer_steps`` batches are kept (vLLM 0.32's replay).
- Converting, encoding and sending happen on the publisher's own thread: the engine only
  puts the step's events (with their time) on a queue of ``max_queue_size``; when that is
  full the batch is dropped and counted (the engine never waits for a slow subscriber or
  network).

Endpoints follow vLLM's rule: the PUB socket binds when the address has a wildcard host
(``tcp://*:5557``, ``tcp://[::]:5557``) or is ``ipc://`` / ``inproc://``, else connects;
the replay socket always binds.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import msgspec
import zmq

from ..core.engine_stats import KvEventStats
from ..core.kv_cache_events import KVCacheEvent
from .config import KVEventsConfig
from .wire import PRIMARY_MEDIUM, KVEventBatch, to_wire

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_SHUTDOWN_TIMEOUT_S = 2.0


@dataclass
class PublisherCounters:
    batches_published: int = 0
    events_published: int = 0
    batches_dropped: int = 0

    def snapshot(self) -> KvEventStats:
        return KvEventStats(kv_events_published=self.events_published,
                            kv_event_batches_published=self.batches_published,
                            kv_event_batches_dropped=self.batches_dropped)


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.config, self.data_parallel_rank = config, data_parallel_rank
        self.counters = PublisherCounters()
        # Every adapter id the engine has registered, with its name (``lora_name`` in
        # ``BlockStored``); never shrinks, so a batch queued before a removal still resolves.
        self.lora_names: dict[int, str] = {}
        self._queue: queue.Queue = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encode = msgspec.msgpack.Encoder().encode
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        if _binds(config.endpoint):
            self._pub.bind(config.endpoint)
        else:
            self._pub.connect(config.endpoint)
        self._replay = None
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(config.replay_endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="paged-core-kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Queue one step's events as one batch (dropped and counted if the queue is full)."""
        try:
            self._queue.put_nowait((time.time(), events))
        except queue.Full:
            self.counters.batches_dropped += 1

    def name_lora(self, lora_id: int, lora_name: str) -> None:
        """Call before the first request under adapter ``lora_id`` runs."""
        self.lora_names[lora_id] = lora_name

    def stats(self) -> KvEventStats:
        return self.counters.snapshot()

    def shutdown(self) -> None:
        """Send what is queued (for up to 2 s), then close the sockets (idempotent)."""
        if not self._running:
            return
        self._running = False
        self._thread.join(timeout=_SHUTDOWN_TIMEOUT_S)
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        seq = 0
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                ts, events = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                payload = self._encode(self._batch(ts, events))
                self._pub.send_multipart((self.config.topic.encode(), seq.to_bytes(8, "big"),
                                          payload))
            except Exception:  # noqa: BLE001 - never take the engine down; say so once per batch
                logger.exception("kv events: could not publish batch %d", seq)
                continue
            self._buffer.append((seq, payload))
            self.counters.batches_published += 1
            self.counters.events_published += len(events)
            seq += 1

    def _batch(self, ts: float, events: list[KVCacheEvent]) -> KVEventBatch:
        return KVEventBatch(ts=ts, events=[to_wire(e, PRIMARY_MEDIUM, self.lora_names) for e in events],
                            data_parallel_rank=self.data_parallel_rank)

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("kv events: replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        topic = self.config.topic.encode()
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard host or a local transport, connect to anything else."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))
