"""Mixtral: Mistral's attention (grouped-query, optional sliding window) with a sparse
mixture of experts (``moe.py``) in every layer: a float32 softmax over the experts, the
top ``num_experts_per_tok`` renormalised to sum to 1 and kept in float32."""
from __future__ import annotations

from .family import ModelFamily
from .llama import LlamaForCausalLM
from .spec import DecoderSpec, MoeSpec, attention_shape


def read_spec(cfg) -> DecoderSpec:
    moe = MoeSpec(num_experts=cfg.num_local_experts, top_k=cfg.num_experts_per_tok,
                  intermediate_size=cfg.intermediate_size, norm_top_k=True, float32_weights=True,
                  sparse_layers=(True,) * cfg.num_hidden_layers)
    return DecoderSpec(**attention_shape(cfg), intermediate_size=cfg.intermediate_size,
                       qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False, moe=moe)


FAMILY = ModelFamily(
    name="Mixtral", model_types=("mixtral",), architectures=("MixtralForCausalLM",),
    read_spec=read_spec, model_class=LlamaForCausalLM,
    tensor_parallel="yes (each expert's width split)", sliding_window="yes",
    gguf="no (transformers reads no Mixtral GGUF)")
