"""Tiny random-weight checkpoints of each supported architecture, saved as Hugging Face folders."""
from __future__ import annotations

import os

import torch

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.2,
              rms_norm_eps=1e-6)


def tiny_config(model_type: str, vocab_size: int):
    from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    if model_type == "llama":
        return LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **COMMON)
    if model_type == "llama3-rope":
        return LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **COMMON)
    if model_type == "mistral":
        return MistralConfig(vocab_size=vocab_size, sliding_window=24, **COMMON)
    if model_type == "qwen2":
        return Qwen2Config(vocab_size=vocab_size, tie_word_embeddings=True, **COMMON)
    if model_type == "qwen3":
        return Qwen3Config(vocab_size=vocab_size, head_dim=32, **COMMON)
    if model_type == "phi3":  # fused qkv_proj / gate_up_proj weights, a sliding window
        return Phi3Config(vocab_size=vocab_size, sliding_window=24, pad_token_id=0, **COMMON)
    if model_type == "phi3-longrope":  # Phi-3.5's kind: short / long factors past 64 positions
        return Phi3Config(vocab_size=vocab_size, pad_token_id=0, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.5] * 4,
            "long_factor": [2.0, 4.0] * 4, "original_max_position_embeddings": 64},
            original_max_position_embeddings=64, **COMMON)
    if model_type == "phi3-partial-rotary":  # Phi-4-mini's kind: rotary over half of each head
        return Phi3Config(vocab_size=vocab_size, pad_token_id=0, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            **COMMON)
    if model_type in MOE:
        return moe_config(model_type, vocab_size)
    if model_type in GEMMA:
        return gemma_config(model_type, vocab_size)
    raise ValueError(model_type)


# Gemma configs: 4 layers alternating sliding (window 24, shorter than the longer prompts)
# and global; Gemma 2 with soft caps small enough to bend the scores and logits of these
# random weights; Gemma 3 with its own RoPE per layer type (a scaled global one).
GEMMA = ("gemma2", "gemma3_text")


def gemma_config(model_type: str, vocab_size: int):
    from transformers import Gemma2Config, Gemma3TextConfig

    shape = {**COMMON, "num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 24,
             "sliding_window": 24, "vocab_size": vocab_size, "pad_token_id": 0,
             "layer_types": ["sliding_attention", "full_attention"] * 2}
    if model_type == "gemma2":
        return Gemma2Config(attn_logit_softcapping=2.0, final_logit_softcapping=5.0, **shape)
    return Gemma3TextConfig(rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}},
        **shape)


# Mixture-of-experts configs: 6 experts, 2 per token (random routers route unevenly), small
# expert widths; Mixtral with a sliding window shorter than the longer prompts, Qwen3-MoE
# with a dense layer (mlp_only_layers), Qwen2-MoE with its gated shared expert.
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def moe_config(model_type: str, vocab_size: int):
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

    experts = dict(num_experts_per_tok=2, vocab_size=vocab_size, **COMMON)
    if model_type == "mixtral":
        return MixtralConfig(num_local_experts=6, sliding_window=24, **experts)
    if model_type == "qwen2_moe":
        return Qwen2MoeConfig(num_experts=6, moe_intermediate_size=48,
                              shared_expert_intermediate_size=96, norm_topk_prob=False,
                              tie_word_embeddings=True, **experts)
    if model_type == "qwen3_moe":
        return Qwen3MoeConfig(num_experts=6, moe_intermediate_size=48, norm_topk_prob=True,
                              mlp_only_layers=[1], head_dim=32, **experts)
    return OlmoeConfig(num_experts=6, norm_topk_prob=False, pad_token_id=0, eos_token_id=0,
                       **experts)


def build_tiny_model(model_type: str, folder: str, tokenizer, **config_overrides) -> str:
    """Random weights (seeded) saved with ``tokenizer`` into ``folder``; returns the folder.
    ``<moe type>-stacked``: the same model with its experts saved stacked, one
    ``experts.gate_up_proj`` / ``experts.down_proj`` tensor per layer (transformers' own
    in-memory layout) instead of one tensor per expert and projection. ``config_overrides``
    replace fields of the tiny config."""
    from transformers import AutoModelForCausalLM

    base_type = model_type.removesuffix("-stacked")
    torch.manual_seed(1234)
    config = tiny_config(base_type, len(tokenizer))
    for field, value in config_overrides.items():
        setattr(config, field, value)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if model_type != base_type:
        _stack_experts(folder)
    return folder


class TinyCheckpoints:
    """Tiny checkpoints built at their first request into ``root`` and shared from then on,
    for tests that only read them (a test that changes one changes a copy): a folder costs a
    ``save_pretrained`` (a quantized one also a quantization pass) and ~30-80 MB of disk, once
    per test process instead of once per parametrized case."""

    def __init__(self, root: str, tokenizer):
        self._root, self._tokenizer, self._built = root, tokenizer, {}

    def model(self, model_type: str) -> str:
        """``build_tiny_model(model_type, ...)``'s folder."""
        return self._once(model_type,
                          lambda folder: build_tiny_model(model_type, folder, self._tokenizer))

    def compressed(self, model_type: str, scheme: str, group_size: int | None = None) -> str:
        """``model(model_type)`` quantized with preset ``scheme`` by
        ``compressed_tensors_checkpoint`` (``group_size`` overriding the preset's)."""
        from paged_core.bench.quantized_models import compressed_tensors_checkpoint

        return self._once(f"{model_type}-{scheme}-{group_size}", lambda folder:
                          compressed_tensors_checkpoint(self.model(model_type), scheme, folder,
                                                        group_size)[0])

    def _once(self, name: str, build) -> str:
        if name not in self._built:
            self._built[name] = build(os.path.join(self._root, name))
        return self._built[name]


def _stack_experts(folder: str) -> None:
    """Rewrite ``folder``'s per-expert weights (``mlp.experts.<e>.gate_proj.weight`` ...)
    as stacked ``mlp.experts.gate_up_proj`` ``[E, 2 * width, hidden]`` and
    ``mlp.experts.down_proj`` ``[E, hidden, width]``."""
    import glob
    import re

    from safetensors.torch import load_file, save_file

    (path,) = glob.glob(os.path.join(folder, "*.safetensors"))
    tensors = load_file(path)
    experts: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for name in [n for n in tensors if ".mlp.experts." in n]:
        prefix, index, part = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(\w+)\.weight", name).groups()
        experts.setdefault(prefix, {})[int(index), part] = tensors.pop(name)
    for prefix, parts in experts.items():
        count = 1 + max(e for e, _ in parts)
        tensors[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([parts[e, "gate_proj"], parts[e, "up_proj"]]) for e in range(count)])
        tensors[f"{prefix}.down_proj"] = torch.stack([parts[e, "down_proj"] for e in range(count)])
    save_file(tensors, path, metadata={"format": "pt"})
