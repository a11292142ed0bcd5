"""The model registry: each ``model_type`` finds its family, an unknown one is refused with
the table of supported architectures, and the README shows that same table."""
from pathlib import Path

import pytest

from paged_core import LLM
from paged_core.models.registry import family_for, model_spec, supported_table
from paged_core.models.sharding import ShardPlan

from ..tiny_models import MOE, tiny_config

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize("model_type,family", [
    ("llama", "Llama"), ("qwen3", "Llama"), ("phi3", "Llama"), ("gemma2", "Gemma"),
    ("gemma3_text", "Gemma"), ("mixtral", "Mixtral"),
    ("qwen2_moe", "Qwen MoE"), ("qwen3_moe", "Qwen MoE"), ("olmoe", "OLMoE")])
def test_each_model_type_finds_its_family(model_type, family, tokenizer):
    config = tiny_config(model_type, len(tokenizer))
    assert family_for(config).name == family
    spec = model_spec(config)
    assert (spec.moe is not None) == (model_type in MOE)


def test_an_unknown_model_is_refused_with_the_supported_table(tmp_path, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2,
                               vocab_size=len(tokenizer))).save_pretrained(folder)
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported") as error:
        LLM(model=str(folder), dtype="float32")
    assert supported_table() in str(error.value)
    assert "| Mixtral | mixtral |" in supported_table()


def test_the_readme_shows_the_registry_table():
    assert supported_table() in README.read_text()


def test_olmoe_refuses_tensor_parallelism_naming_why(tokenizer):
    spec = model_spec(tiny_config("olmoe", len(tokenizer)))
    with pytest.raises(ValueError, match="q/k norms over all heads .*allowed sizes: \\[1\\]"):
        ShardPlan(spec, 0, 2)
