"""BentoML and LitServe, each started the documented way, against the same OpenAI checks."""
from __future__ import annotations

import signal

import httpx
import pytest

from . import openai_checks as checks
from . import tool_call_checks as tool_checks
from .conftest import free_port, python_cmd, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _launch(adapter: str, port: int) -> tuple[list[str], str, str]:
    """(documented command, readiness path, engine-metrics path) of ``adapter``."""
    if adapter == "bentoml":
        return (python_cmd("-m", "bentoml", "serve", "paged_core.adapters.bentoml.service:PagedLLM",
                           "--host", "127.0.0.1", "--port", str(port)),
                "/readyz", "/metrics")
    return (python_cmd("-m", "paged_core.adapters.litserve", "--host", "127.0.0.1",
                       "--port", str(port)),
            "/health", "/metrics")


@pytest.fixture(scope="module", params=["bentoml", "litserve"])
def served(request, log_dir):
    """One server per adapter for the whole module, stopped (SIGINT, then SIGKILL) after it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd, ready_path, metrics_path = _launch(request.param, port)
    with running_server(request, request.param, cmd, url + ready_path, log_dir,
                        signal.SIGINT) as server:
        yield checks.Served(request.param, url, metrics_path)
    # the documented stop ends it, after every check here (a client that timed out waiting
    # for a whole completion once kept BentoML's shutdown waiting until it was killed)
    assert server.returncode != -signal.SIGKILL, f"{request.param} had to be killed"


def test_greedy_matches_offline_llm(served, reference_texts):
    checks.greedy(served, reference_texts)


def test_streaming_concatenates_to_the_full_text(served, reference_texts):
    checks.streaming(served, reference_texts)


def test_16_streams_overlap_in_one_engine(served):
    checks.concurrency(served, 16)


def test_prometheus_metrics_hold_engine_state_and_latencies(served):
    text = httpx.get(served.base_url + served.metrics_path, timeout=10).text
    for name in ("paged_core_kv_cache_usage_ratio", "paged_core_prefix_cache_hits_total",
                 "paged_core_num_requests_running", "paged_core_time_to_first_token_seconds_bucket",
                 "paged_core_inter_token_latency_seconds_bucket"):
        assert name in text
    if served.name == "bentoml":  # the engine's metrics join BentoML's own
        assert "bentoml_service_request_total" in text
        engine_only = httpx.get(served.base_url + "/engine/metrics", timeout=10).text
        assert "paged_core_kv_blocks_total" in engine_only and "bentoml_" not in engine_only


def test_client_disconnect_aborts_and_frees_blocks(served):
    checks.disconnect(served)


def test_non_streaming_client_timeout_aborts_and_frees_blocks(served):
    checks.disconnect_non_streaming(served)


@pytest.mark.parametrize("path,body,status,param,fragment", checks.BAD_REQUESTS,
                         ids=lambda v: v if isinstance(v, str) and v.startswith("/") else None)
def test_bad_input_is_a_clear_4xx_and_the_server_keeps_serving(served, path, body, status,
                                                                param, fragment):
    checks.bad_input(served, path, body, status, param, fragment)


def test_forced_tool_calls_and_tool_result_round_trip(served):
    tool_checks.forced_tool_calls(served)


def test_response_format_json_schema(served):
    tool_checks.json_schema_response(served)
