"""vllm-router's command line for a cluster: each replica's KV-event and replay endpoints go
to ``kv_aware`` only (vllm-router refuses them with any other policy), with the engine's block
size and the served model's name; session affinity is a kv_aware setting; bad policies are
refused naming the choices."""
import pytest

from paged_core.adapters.cluster.replicas import Replica
from paged_core.adapters.cluster.router import POLICIES, router_command

REPLICAS = [Replica(8001, 5001, 6001), Replica(8002, 5002, 6002)]


def _values(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command) if arg == flag]


def test_kv_aware_subscribes_to_every_replica():
    command = router_command("kv_aware", "127.0.0.1", 9000, 9001, REPLICAS, 32, "smol", 600)
    assert command[command.index("--worker-urls") + 1:][:2] == [
        "http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert _values(command, "--kv-event-source") == [
        "http://127.0.0.1:8001=tcp://127.0.0.1:5001", "http://127.0.0.1:8002=tcp://127.0.0.1:5002"]
    assert _values(command, "--kv-event-replay-source") == [
        "http://127.0.0.1:8001=tcp://127.0.0.1:6001", "http://127.0.0.1:8002=tcp://127.0.0.1:6002"]
    assert _values(command, "--kv-event-block-size") == ["32"]
    assert _values(command, "--kv-event-model") == ["smol"]
    assert _values(command, "--kv-aware-session-affinity-ttl-secs") == ["600"]
    assert _values(command, "--prometheus-port") == ["9001"]


def test_other_policies_get_no_event_sources():
    command = router_command("round_robin", "127.0.0.1", 9000, 9001, REPLICAS, 16, "smol")
    assert _values(command, "--policy") == ["round_robin"]
    assert not any(arg.startswith("--kv-") for arg in command)
    with pytest.raises(ValueError, match="session affinity is a setting of the kv_aware"):
        router_command("round_robin", "127.0.0.1", 9000, 9001, REPLICAS, 16, "smol", 60)
    with pytest.raises(ValueError, match=r"policy must be one of .*kv_aware"):
        router_command("least_busy", "127.0.0.1", 9000, 9001, REPLICAS, 16, "smol")
    assert "kv_aware" in POLICIES
