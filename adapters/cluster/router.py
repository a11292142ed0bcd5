"""vllm-router in front of the replicas: its command line, from the replicas' ports.

``kv_aware`` (the default) is given every replica's KV-event and replay endpoints, the
engine's block size and the served model's name, and optionally its session affinity: a
request carrying an ``x-session-id`` header goes where that session's last request went
while the session has been idle less than the TTL (a tenant's requests then stay together
even before the router has seen their prefix cached); the other policies (``round_robin``,
``cache_aware``: a router-side radix tree of request text, ``power_of_two``, ...) route
without events. Its Prometheus exporter gets a free port of its own (the router's default
port would collide between two routers on one host).
"""
from __future__ import annotations

import os
import shutil
import sys

from .replicas import Replica

POLICIES = ("kv_aware", "round_robin", "cache_aware", "power_of_two", "consistent_hash",
            "random")


def router_executable() -> str:
    """The ``vllm-router`` beside this interpreter (else on PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "vllm-router")
    found = beside if os.access(beside, os.X_OK) else shutil.which("vllm-router")
    if found is None:
        raise ValueError("the cluster's router is vllm-router, which is not installed: "
                         "pip install 'paged-core[router]'")
    return found


def router_command(policy: str, host: str, port: int, metrics_port: int,
                   replicas: list[Replica], block_size: int, model_name: str,
                   session_affinity_ttl_s: int | None = None) -> list[str]:
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if session_affinity_ttl_s is not None and policy != "kv_aware":
        raise ValueError("session affinity is a setting of the kv_aware policy")
    command = [router_executable(), "--host", host, "--port", str(port),
               "--policy", policy, "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(metrics_port), "--log-level", "warning",
               "--worker-urls", *[r.url for r in replicas]]
    if policy == "kv_aware":
        for r in replicas:
            command += ["--kv-event-source", f"{r.url}={r.events_endpoint}",
                        "--kv-event-replay-source", f"{r.url}={r.replay_endpoint}"]
        command += ["--kv-event-block-size", str(block_size), "--kv-event-model", model_name]
        if session_affinity_ttl_s is not None:
            command += ["--kv-aware-session-affinity-ttl-secs", str(session_affinity_ttl_s)]
    return command
