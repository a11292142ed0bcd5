"""Start a cluster (replicas, then the router), and always stop all of it.

``running_cluster`` starts every replica at once, waits until each answers ``/v1/models``,
reads the served model's name from the first, then starts vllm-router and waits until it
answers too; on the way out it stops the router, then every replica (the adapters'
``stop_child``: their whole process trees). ``serve_cluster`` holds one in the foreground
until Ctrl-C, or until any of its processes exits.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

from paged_core.config import EngineConfig

from .._process import free_port, popen_session, stop_child, wait_ready
from .replicas import Replica
from .router import router_command

_POLL_S = 1.0


@dataclass(frozen=True)
class Cluster:
    url: str  # the router's OpenAI base URL (``http://HOST:PORT/v1``)
    replica_urls: list[str]  # each replica's OpenAI base URL
    router_metrics_url: str  # the router's Prometheus exporter
    model_name: str


@contextlib.contextmanager
def running_cluster(config: EngineConfig, replicas: int = 2, adapter: str = "litserve",
                    policy: str = "kv_aware", host: str = "127.0.0.1", port: int | None = None,
                    threads_per_replica: int | None = None, log_dir: str | None = None,
                    ready_timeout_s: float = 600.0,
                    session_affinity_ttl_s: int | None = None) -> Iterator[Cluster]:
    """``replicas`` servers of ``config`` through ``adapter`` behind vllm-router's ``policy``
    (with ``kv_aware``, optionally its session affinity: ``router``) on ``host:port`` (a free
    port if ``None``). Each replica gets ``threads_per_replica``
    OpenMP threads (default: the cores shared out). Output goes to files in ``log_dir``
    (``None``: to our own stdout and stderr)."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    threads = threads_per_replica or max(1, (os.cpu_count() or 1) // replicas)
    members = [Replica.on_free_ports() for _ in range(replicas)]
    port = port or free_port()
    metrics_port = free_port()
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="paged-core-cluster-"))
        procs: list[tuple[str, subprocess.Popen]] = []
        stack.callback(_stop_all, procs)  # before the scratch folder goes
        for i, member in enumerate(members):
            log = _log_file(stack, log_dir, f"replica-{i}")
            home = os.path.join(scratch, f"replica-{i}")
            procs.append((f"replica {i}", member.start(adapter, config, threads, log, home)))
        for member, (name, proc) in zip(members, procs):
            _wait(name, f"{member.url}/v1", proc, ready_timeout_s, log_dir)
        model_name = _served_model(members[0].url)
        command = router_command(policy, host, port, metrics_port, members,
                                 config.block_size, model_name, session_affinity_ttl_s)
        log = _log_file(stack, log_dir, "router")
        router = popen_session(command, stdout=log,
                               stderr=None if log is None else subprocess.STDOUT)
        procs.insert(0, ("router", router))  # stopped first
        _wait("router", f"http://{host}:{port}/v1", router, ready_timeout_s, log_dir)
        yield Cluster(url=f"http://{host}:{port}/v1", replica_urls=[f"{m.url}/v1" for m in members],
                      router_metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
                      model_name=model_name)


def serve_cluster(config: EngineConfig, replicas: int, adapter: str, policy: str, host: str,
                  port: int, session_affinity_ttl_s: int | None = None) -> None:
    """Serve until Ctrl-C or SIGTERM; raise ``SystemExit`` if the router or a replica stops
    answering first. Either way every process of the cluster is stopped."""
    def _terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with running_cluster(config, replicas, adapter, policy, host, port,
                             session_affinity_ttl_s=session_affinity_ttl_s) as cluster:
            print(f"paged-core cluster: {replicas} {adapter} replicas behind vllm-router "
                  f"({policy}) at {cluster.url}; replicas at {' '.join(cluster.replica_urls)}",
                  flush=True)
            while _healthy(cluster):
                time.sleep(_POLL_S)
            raise SystemExit("a cluster process stopped answering; shutting down")
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous)


def _served_model(replica_url: str) -> str:
    import httpx  # the router extra's client: `paged-core --help` must not need it

    return httpx.get(f"{replica_url}/v1/models", timeout=10).json()["data"][0]["id"]


def _healthy(cluster: Cluster) -> bool:
    import httpx

    try:
        return httpx.get(f"{cluster.url}/models", timeout=30).status_code == 200 and all(
            httpx.get(f"{url}/models", timeout=30).status_code == 200
            for url in cluster.replica_urls)
    except httpx.HTTPError:
        return False


def _log_file(stack: contextlib.ExitStack, log_dir: str | None, name: str):
    if log_dir is None:
        return None
    return stack.enter_context(open(os.path.join(log_dir, f"{name}.log"), "w"))


def _wait(name: str, url: str, proc: subprocess.Popen, timeout_s: float,
          log_dir: str | None) -> None:
    try:
        wait_ready(url, proc, timeout_s)
    except RuntimeError as exc:
        where = f"; its log: {os.path.join(log_dir, name.replace(' ', '-'))}.log" if log_dir else ""
        raise RuntimeError(f"cluster {name}: {exc}{where}") from None


def _stop_all(procs: list[tuple[str, subprocess.Popen]]) -> None:
    """Stop the router, then every replica at once (each may take its grace period)."""
    if procs and procs[0][0] == "router":
        stop_child(procs[0][1], grace_s=10.0)
        procs = procs[1:]
    with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
        list(pool.map(lambda item: stop_child(item[1], grace_s=20.0), procs))
