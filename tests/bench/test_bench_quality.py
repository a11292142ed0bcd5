"""``paged-core bench quality --quick``: sane perplexities per weight format, JSON + PNG.

The embedded model's dense weights are transformers' dequantization of its Q4_1 GGUF file, so
the Q4_1 row serves the same weights 4-bit: its perplexity is the dense one up to rounding
(bfloat16 scales, the 4-bit kernel's summation order), not that of an unquantized model."""
import json
import math

import pytest
import torch

from paged_core import LLM
from paged_core.bench.cli import main
from paged_core.bench.quality import text_logprobs
from paged_core.bench.quality_text import quality_text


@pytest.mark.extended
def test_quick_run_writes_sane_perplexities(tmp_path):
    assert main(["quality", "--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results" / "quality.json").read_text())
    assert result["command"].startswith("paged-core bench quality --quick")
    assert {"cpu", "cores", "threads", "torch"} <= set(result["machine"])
    assert (tmp_path / "results" / "quality.png").stat().st_size > 0
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows) == {"bf16 dense", "float32 dense", "gguf Q4_1"}
    for row in rows.values():
        assert row["kv_cache_dtype"] == "auto" and row["tokens_scored"] > 100
        assert math.isfinite(row["perplexity"]) and row["perplexity"] > 1
        ratio = row["perplexity"] / rows["bf16 dense"]["perplexity"]
        assert math.isclose(row["ratio_to_bf16"], ratio)
    fp32 = rows["float32 dense"]["perplexity"]
    assert abs(rows["bf16 dense"]["perplexity"] / fp32 - 1) < 0.03
    assert 0.98 < rows["gguf Q4_1"]["perplexity"] / fp32 < 2


def test_text_logprobs_match_transformers_whatever_the_chunk(hf_embedded, tokenizer):
    ids = tokenizer.encode(quality_text())[:40]
    llm = LLM(dtype="float32", enable_prefix_caching=False, num_kv_blocks=8)
    with torch.no_grad():
        logits = hf_embedded(torch.tensor([ids])).logits[0, :-1]
    rows, targets = torch.arange(len(ids) - 1), torch.tensor(ids[1:])
    expected = torch.log_softmax(logits.float(), -1)[rows, targets]
    for chunk in (1, 16, 64):
        assert torch.allclose(text_logprobs(llm, ids, chunk), expected, atol=1e-3)
    llm.shutdown()


def test_every_row_is_scored_with_every_kv_cache_dtype(monkeypatch, tokenizer):
    """The rows and their engine arguments (no engine built: ``LLM`` and the scorer faked)."""
    import argparse

    import paged_core
    from paged_core.bench import quality

    built = []

    class FakeLLM:
        def __init__(self, model=None, **kwargs):
            built.append({"model": model, **kwargs})

        def get_tokenizer(self):
            return tokenizer

        def shutdown(self):
            pass

    def fake_logprobs(llm, ids, chunk):  # int8 KV: twice the baseline's mean NLL
        return torch.full((len(ids) - 1,), -2.0 if built[-1].get("kv_cache_dtype") else -1.0)

    monkeypatch.setattr(paged_core, "LLM", FakeLLM)
    monkeypatch.setattr(quality, "text_logprobs", fake_logprobs)
    args = argparse.Namespace(dtype="bfloat16", model=["/ckpt/W4A16/"], chunk=16,
                              kv_cache_dtypes="int8,auto")
    rows = quality.run(args)["rows"]
    assert [(r["name"], r["kv_cache_dtype"]) for r in rows] == [
        (name, kv) for name in ("bf16 dense", "float32 dense", "gguf Q4_1", "W4A16")
        for kv in ("auto", "int8")]
    assert [b.get("kv_cache_dtype") for b in built] == [None, "int8"] * 4
    assert built[5] == {"model": None, "dtype": "bfloat16", "quantization": "gguf",
                        "kv_cache_dtype": "int8", "enable_prefix_caching": False,
                        "num_kv_blocks": 64}
    assert built[6]["model"] == "/ckpt/W4A16/"
    assert rows[0]["ratio_to_bf16"] == 1 and math.isclose(rows[1]["ratio_to_bf16"], math.e)
