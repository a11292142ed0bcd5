"""Fuzzing the OpenAI routes (hypothesis): bodies built from the app's own OpenAPI schema,
every field given a value of its declared type or any JSON value (huge integers, lone
surrogates, nesting), plus unknown fields. Invariant: never a 5xx, never a hang, and the
server serves normally afterwards with nothing held."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from paged_core import AsyncEngine, EngineConfig
from paged_core.openai import build_openai_app

ROUTES = {"/v1/completions": "CompletionRequest", "/v1/chat/completions": "ChatCompletionRequest"}
INTS = st.one_of(st.integers(-3, 70), st.integers(-2**70, 2**70))
TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["\ud800", "a\udfffb", "", "x" * 300]))
JSON = st.recursive(st.one_of(st.none(), st.booleans(), INTS, TEXT,
                              st.floats(allow_nan=False, allow_infinity=False)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(TEXT, inner, max_size=3)),
                    max_leaves=8)
TYPED = {"integer": INTS, "number": st.floats(-1e6, 1e6, allow_nan=False), "boolean": st.booleans(),
         "string": TEXT}


@pytest.fixture(scope="module")
def client(tiny_folder):
    engine = AsyncEngine(EngineConfig(model=tiny_folder, dtype="float32", num_kv_blocks=64,
                                      max_model_len=64, max_waiting_requests=8))
    app = build_openai_app(engine)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.schemas = app.openapi()["components"]["schemas"]
        yield c
    engine.shutdown_sync()


def value_for(schema: dict) -> st.SearchStrategy:
    kinds = [s.get("type") for s in schema.get("anyOf", [schema])]
    typed = [TYPED[k] for k in kinds if k in TYPED]
    if "array" in kinds:
        typed.append(st.lists(st.one_of(INTS, TEXT), max_size=5))
    return st.one_of(*typed, JSON) if typed else JSON


@st.composite
def request_bodies(draw, schemas: dict) -> tuple[str, dict]:
    path = draw(st.sampled_from(sorted(ROUTES)))
    props = schemas[ROUTES[path]]["properties"]
    well_formed = draw(st.booleans())  # a valid core and few odd fields: reaches the engine
    names = draw(st.lists(st.sampled_from(sorted(props)), unique=True,
                          max_size=1 if well_formed else 8))
    body = {name: draw(value_for(props[name])) for name in names}
    if well_formed:
        if path == "/v1/completions":
            body["prompt"] = draw(st.one_of(TEXT, st.lists(INTS, min_size=1, max_size=5)))
        else:
            body["messages"] = [{"role": "user", "content": draw(TEXT)}]
        body["max_tokens"] = draw(st.integers(1, 8))
    body.update(draw(st.dictionaries(st.text(min_size=1, max_size=8).filter(
        lambda k: k not in props), JSON, max_size=2)))
    return path, body


def test_no_body_gets_a_5xx_and_the_server_stays_healthy(client):
    statuses: dict[int, int] = {}

    @settings(max_examples=400, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(request=request_bodies(client.schemas))
    def check(request):
        path, body = request
        response = client.post(path, content=json.dumps(body),
                               headers={"content-type": "application/json"})
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, (path, body, response.text[:500])
        if response.status_code >= 400:
            assert set(response.json()["error"]) >= {"message", "type", "param", "code"}

    check()
    print("statuses:", statuses)
    assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 20  # both paths exercised
    response = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert response.status_code == 200 and client.get("/health").status_code == 200
    stats = client.get("/metrics").text
    assert "paged_core_kv_blocks_used 0.0" in stats and "paged_core_num_requests_running 0.0" in stats
