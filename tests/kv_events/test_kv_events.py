"""KV-cache events in vLLM's wire format: a plain ZMQ SUB socket reads every batch, decoded
from raw msgpack by vLLM 0.32's published layout (``vllm.distributed.kv_events``); the stored
/ removed / cleared events replay the block pool's own transitions exactly (prefix hits,
eviction under pressure, a reset), sequence numbers have no gaps, the replay socket returns
what a late subscriber missed, and a block's LoRA adapter and cache salt travel with it."""
import socket
import time
from typing import Any, NamedTuple

import msgspec
import pytest
import zmq

from paged_core import LLM, SamplingParams
from paged_core.config import EngineConfig
from paged_core.core.block_hash import hash_block
from paged_core.lora.request import LoRARequest

from ..lora.adapters import make_adapter
from ..reference import passage_token_ids
from ..tiny_models import build_tiny_model


# vLLM's wire layout (``vllm.distributed.kv_events``: msgspec structs), read from the raw
# msgpack: a batch is the array ``[ts, events, data_parallel_rank]``, an event a map tagged
# with its class name under "type" (optional fields left out when at their defaults).
class BlockStored(NamedTuple):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list
    block_size: int
    lora_id: Any
    medium: Any
    lora_name: Any
    extra_keys: Any = None


class BlockRemoved(NamedTuple):
    block_hashes: list
    medium: Any


class AllBlocksCleared(NamedTuple):
    pass


class Batch(NamedTuple):
    ts: float
    events: list
    data_parallel_rank: int


TAGS = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved,
        "AllBlocksCleared": AllBlocksCleared}


def decode(payload: bytes) -> Batch:
    ts, events, rank = msgspec.msgpack.decode(payload)
    return Batch(ts, [TAGS[e.pop("type")](**e) for e in events], rank)


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Subscriber:
    """A SUB socket connected to the engine's PUB (which binds its ``ipc://`` address, by
    vLLM's rule); keeps every message in order."""

    def __init__(self, endpoint: str, topic: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.messages: list[tuple[int, bytes]] = []

    def drain(self, expect_at_least: int = 0, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                self.messages.append((int.from_bytes(seq, "big"), payload))
            elif len(self.messages) >= expect_at_least:
                return

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


def _apply(cached: set, events, block_size: int) -> None:
    """Track the cached hashes as the events say, checking each stored run's chain."""
    for event in events:
        if isinstance(event, BlockStored):
            assert event.block_size == block_size and event.medium == "GPU"  # vLLM's own tier
            assert event.lora_id is None and event.lora_name is None
            assert event.extra_keys == [None] * len(event.block_hashes)
            assert len(event.token_ids) == block_size * len(event.block_hashes)
            parent = event.parent_block_hash
            for i, h in enumerate(event.block_hashes):
                assert h == hash_block(parent, event.token_ids[i * block_size:(i + 1) * block_size])
                parent = h
            assert not cached & set(event.block_hashes)
            cached |= set(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            assert set(event.block_hashes) <= cached
            cached -= set(event.block_hashes)
        else:
            cached.clear()


def test_events_replay_the_block_pools_transitions(tokenizer, tmp_path):
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    replay_port = _free_port()
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv",
              "endpoint": f"ipc://{tmp_path}/kv-events",
              "replay_endpoint": f"tcp://127.0.0.1:{replay_port}"}
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=12, block_size=16,
              kv_events_config=config)
    sub = Subscriber(config["endpoint"], "kv")
    pool = llm.engine.core.kv.pool
    cached: set = set()
    seen = 0
    try:
        time.sleep(0.5)  # the PUB socket's connection comes up (ZMQ's slow joiner)
        shared = passage_token_ids(tokenizer, 40)
        scripts = [
            [shared],  # 3 blocks stored (2 of prompt, the third filled while decoding)
            [shared + passage_token_ids(tokenizer, 9, offset=50)],  # hits the first 2 blocks
            [passage_token_ids(tokenizer, 60, offset=100 + 70 * i) for i in range(3)],  # evicts
        ]
        for prompts in scripts:
            llm.generate(prompts, GREEDY, use_tqdm=False)
            sub.drain(expect_at_least=seen + 1)
            for _, payload in sub.messages[seen:]:
                _apply(cached, decode(payload).events, 16)
            seen = len(sub.messages)
            assert cached == set(pool.cached_blocks)  # exactly the pool's cached blocks
        events = [e for _, p in sub.messages for e in decode(p).events]
        assert any(isinstance(e, BlockRemoved) for e in events)  # eviction under pressure
        llm.reset_prefix_cache()
        sub.drain(expect_at_least=seen + 1)
        (last,) = [decode(p) for _, p in sub.messages[seen:]]
        assert [type(e) for e in last.events] == [AllBlocksCleared] and not pool.cached_blocks
        sequence = [seq for seq, _ in sub.messages]
        assert sequence == list(range(len(sequence)))  # no gaps, from 0
        stats = llm.stats()
        assert stats["kv_events_published"] == len(events) + 1
        assert stats["kv_event_batches_dropped"] == 0
        # A late subscriber asks the replay socket for everything since batch 2.
        dealer = sub.ctx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (2).to_bytes(8, "big")])
        replayed = []
        while True:
            assert dealer.poll(10_000)
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert (topic, payload) == (b"", b"")
                break
            assert topic == b"kv"
            replayed.append((int.from_bytes(seq, "big"), payload))
        dealer.close(linger=0)
        assert replayed == sub.messages[2:]
    finally:
        llm.shutdown()
        sub.close()


def test_the_setting_is_checked_and_read_from_json(monkeypatch):
    assert EngineConfig().kv_events_config is None
    monkeypatch.setenv("PAGED_CORE_KV_EVENTS_CONFIG", '{"enable_kv_cache_events": true}')
    config = EngineConfig.from_env().kv_events_config
    assert config.publisher == "zmq" and config.endpoint == "tcp://*:5557"  # vLLM's defaults
    assert not EngineConfig(kv_events_config={"publisher": "zmq"}).kv_events_config.publishes
    with pytest.raises(ValueError, match=r"kv_events_config\['publisher'\] must be one of"):
        EngineConfig(kv_events_config={"enable_kv_cache_events": True, "publisher": "nats"})
    with pytest.raises(ValueError, match=r"kv_events_config has unknown key\(s\) \['port'\]"):
        EngineConfig(kv_events_config={"port": 5557})
    with pytest.raises(ValueError, match=r"kv_events_config\['buffer_steps'\] must be a positive"):
        EngineConfig(kv_events_config={"buffer_steps": 0})


def test_stored_blocks_carry_their_adapter_and_salt(tokenizer, tmp_path):
    """vLLM's fields for what a block's hash chains from besides its tokens: ``lora_id`` and
    ``lora_name``, and ``extra_keys`` per block (the LoRA name; the cache salt on the first)."""
    folder = build_tiny_model("llama", str(tmp_path / "llama"), tokenizer)
    adapter = make_adapter(folder, str(tmp_path / "r8"), 8, seed=1)
    config = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/kv-events"}
    llm = LLM(model=folder, dtype="float32", num_kv_blocks=32, block_size=16, enable_lora=True,
              max_lora_rank=8, kv_events_config=config)
    sub = Subscriber(config["endpoint"], "")
    try:
        time.sleep(0.5)  # ZMQ's slow joiner
        prompt = passage_token_ids(tokenizer, 40)
        greedy = SamplingParams(temperature=0, max_tokens=1)
        llm.generate([{"prompt_token_ids": prompt, "cache_salt": "tenant-a"}], greedy,
                     use_tqdm=False, lora_request=LoRARequest("sql", 7, adapter))
        sub.drain(expect_at_least=1)
        (stored,) = [e for _, p in sub.messages for e in decode(p).events]
        assert (stored.lora_id, stored.lora_name, stored.parent_block_hash) == (7, "sql", None)
        assert stored.token_ids == prompt[:32]
        assert stored.extra_keys == [["sql", "tenant-a"], ["sql"]]  # msgpack tuples: arrays
    finally:
        llm.shutdown()
        sub.close()
