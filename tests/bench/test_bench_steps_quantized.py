"""``paged-core bench steps --quantized KIND --max-num-seqs N``: the step breakdown of the
embedded model served quantized, never more than N sequences a step."""
import json

from paged_core.bench.cli import main


def test_steps_of_the_gguf_q4_1_weights_at_two_sequences(tmp_path):
    assert main(["steps", "--quick", "--quantized", "gguf-q4_1", "--max-num-seqs", "2",
                 "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results" / "steps.json").read_text())
    assert result["quantized"] == "gguf-q4_1" and result["max_num_seqs"] == 2
    assert result["output_tokens"] == result["workload"]["output_tokens"]
    assert max(step["num_seqs"] for step in result["steps"]) == 2
    # The 4-bit projections are read, not a bfloat16 copy of them: the embedded model's
    # bfloat16 weights a decode step reads are ~269 MB, its Q4_1 ones ~103 MB.
    assert 0 < result["memory"]["weight_bytes"] < 150e6
    assert "gguf-q4_1 weights" in (tmp_path / "README.md").read_text()
