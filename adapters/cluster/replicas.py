"""One replica of a cluster: an adapter's server on its own ports, publishing KV events.

Invariant: every port is on 127.0.0.1 and was free when chosen; the event sockets bind
(``tcp://*:PORT``, vLLM's rule: a wildcard host binds) and the router connects to them
on 127.0.0.1.
"""
from __future__ import annotations

import dataclasses
import subprocess
from dataclasses import dataclass
from typing import IO

from paged_core.config import EngineConfig

from .._process import child_env, free_port, popen_session
from ..launch import bentoml_command, litserve_command

REPLICA_ADAPTERS = ("bentoml", "litserve")  # the adapters that serve the OpenAI routes


@dataclass(frozen=True)
class Replica:
    """Where one replica listens: HTTP, its KV-event PUB socket, its replay socket."""

    http_port: int
    events_port: int
    replay_port: int

    @classmethod
    def on_free_ports(cls) -> "Replica":
        return cls(free_port(), free_port(), free_port())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def engine_config(self, config: EngineConfig) -> EngineConfig:
        """``config`` publishing this replica's KV events (vLLM's ``kv_events_config``)."""
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{self.events_port}",
                  "replay_endpoint": f"tcp://*:{self.replay_port}"}
        return dataclasses.replace(config, kv_events_config=events)

    def start(self, adapter: str, config: EngineConfig, threads: int, log: IO | None,
              scratch_dir: str) -> subprocess.Popen:
        """Start the server (``threads`` OpenMP threads; output to ``log``, else ours).
        A BentoML replica gets ``scratch_dir`` as its ``BENTOML_HOME``: BentoML empties
        ``$BENTOML_HOME/prometheus_multiproc_dir`` when it starts, so replicas sharing one
        home would wipe and mix each other's metrics."""
        if adapter not in REPLICA_ADAPTERS:
            raise ValueError(f"a replica's adapter must be one of {REPLICA_ADAPTERS}, got "
                             f"{adapter!r}")
        command = (bentoml_command if adapter == "bentoml" else litserve_command)(
            "127.0.0.1", self.http_port)
        extra = {"OMP_NUM_THREADS": str(threads)}
        if adapter == "bentoml":
            extra["BENTOML_HOME"] = scratch_dir
        env = child_env(self.engine_config(config), extra)
        return popen_session(command, env=env, stdout=log,
                             stderr=None if log is None else subprocess.STDOUT)
