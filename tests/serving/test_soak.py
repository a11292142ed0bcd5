"""CI-sized ``bench soak`` (in-process app, tiny model, 200 requests): every outcome kind
happens, no request fails or hangs, and the engine ends with nothing held or queued."""
from __future__ import annotations

import argparse

from paged_core.bench import soak
from paged_core.bench.soak_mix import make_mix


def test_the_mix_holds_every_kind_of_request():
    mix = make_mix(1000, seed=3)
    assert 0.05 < sum(r.malformed for r in mix) / 1000 < 0.15
    assert 0.2 < sum(r.disconnect_after is not None for r in mix) / 1000 < 0.4
    valid = [r.body for r in mix if not r.malformed]
    assert {b["n"] for b in valid} == {1, 2, 3} and any("timeout" in b for b in valid)
    assert any("messages" in b for b in valid) and len({b["priority"] for b in valid}) > 2
    assert make_mix(50, seed=3) == mix[:50]  # seeded


async def test_soak_in_process_leaves_nothing_behind(tiny_folder):
    """In bfloat16 and batch-invariant mode: greedy probes under the load equal their answers
    on the idle server."""
    args = argparse.Namespace(quick=True, requests=200, seed=0, dtype="bfloat16",
                              model=tiny_folder, in_process=True, url=None, adapter=None,
                              concurrency=40, hang_timeout=60.0, rss_interval=0.5)
    settings = dict(soak.SERVER_SETTINGS, dtype="bfloat16", model=tiny_folder,
                    batch_invariant=True)
    result = await soak._soak(args, make_mix(200, 0), settings)
    soak.print_summary(result)
    counts = result["counts"]
    assert counts["error"] == 0, result["error_samples"]
    assert sum(counts.values()) == 200
    for kind in ("completed", "rejected", "aborted", "bad_request"):
        assert counts[kind] > 0, counts
    assert result["final"] == {"kv_blocks_used": 0, "num_running": 0, "num_waiting": 0}
    assert result["server_alive"] and result["preemptions"] > 0
    probes = result["batch_invariance"]
    assert probes["checked"] >= 1 and probes["identical"] == probes["checked"], probes
