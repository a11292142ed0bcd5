"""Typed engine stats: fields by name, and the flat mapping of numbers metric exporters, JSON
output and existing callers read (nested stats flattened, absent parts left out)."""
import dataclasses
import json

from paged_core.core.engine_stats import EngineStats, KvCacheStats, SpecDecodeStats

KV = KvCacheStats(kv_blocks_total=10, kv_blocks_used=4, kv_blocks_cached=1, kv_blocks_free=5,
                  kv_usage=0.4, prefix_cache_queries=32, prefix_cache_hits=16)


def _engine_stats(**extra) -> EngineStats:
    return EngineStats(kv=KV, num_running=2, num_waiting=1, num_requests=3, num_preemptions=0,
                       generated_tokens=7, **extra)


def test_the_mapping_view_is_every_number_flattened_in_field_order():
    stats = _engine_stats()
    assert stats.kv.kv_blocks_used == 4 and stats.num_running == 2
    assert list(stats) == ["kv_blocks_total", "kv_blocks_used", "kv_blocks_cached", "kv_blocks_free",
                           "kv_usage", "prefix_cache_queries", "prefix_cache_hits", "num_running",
                           "num_waiting", "num_requests", "num_preemptions", "generated_tokens"]
    assert stats["kv_blocks_used"] == 4 and stats["generated_tokens"] == 7 and len(stats) == 12
    assert "spec_decode_num_drafts" not in stats and "num_rejected" not in stats
    assert json.loads(json.dumps(stats.as_dict())) == dict(stats)


def test_optional_parts_appear_once_present():
    spec = SpecDecodeStats(spec_decode_num_drafts=2, spec_decode_num_draft_tokens=6,
                           spec_decode_num_accepted_tokens=3,
                           spec_decode_mean_acceptance_length=2.5,
                           spec_decode_draft_acceptance_rate=0.5)
    stats = dataclasses.replace(_engine_stats(spec_decode=spec), num_rejected=4)
    assert stats["spec_decode_draft_acceptance_rate"] == 0.5 and stats["num_rejected"] == 4
    assert stats.spec_decode.spec_decode_num_drafts == 2 and len(stats) == 12 + 5 + 1
