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
    raise ValueError(model_type)


def build_tiny_model(model_type: str, folder: str, tokenizer) -> str:
    """Random weights (seeded) saved with ``tokenizer`` into ``folder``; returns the folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1234)
    config = tiny_config(model_type, len(tokenizer))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
