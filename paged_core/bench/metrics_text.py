"""Values read from a server's Prometheus text (``GET /metrics``): how ``bench`` and the
end-to-end tests see a running replica's counters and gauges."""
from __future__ import annotations

import re


def sample_value(text: str, name: str) -> float | None:
    """The value of the first sample named ``name`` (whatever its labels) in Prometheus
    exposition ``text``; ``None`` when there is none."""
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def scrape(replica_url: str, names: list[str]) -> dict[str, float]:
    """``names``' values from the ``/metrics`` of the server at ``replica_url`` (its OpenAI
    base URL, ``/v1`` or not); a missing one raises ``KeyError`` naming it."""
    import httpx

    text = httpx.get(replica_url.removesuffix("/v1") + "/metrics", timeout=30).text
    values = {name: sample_value(text, name) for name in names}
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise KeyError(f"{replica_url}/metrics has no {', '.join(missing)}")
    return values
