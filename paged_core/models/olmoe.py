"""OLMoE: Llama attention whose q and k go through an RMSNorm over all heads at once
(before being cut into heads), and a sparse mixture of experts in every layer: float32
softmax, top ``num_experts_per_tok`` (renormalised where ``norm_topk_prob`` says), cast to
the model's dtype. The norms over all heads need every head on one rank: tensor
parallelism 1 only. ``clip_qkv`` is refused."""
from __future__ import annotations

from .family import ModelFamily
from .llama import LlamaForCausalLM
from .spec import DecoderSpec, MoeSpec, attention_shape


def read_spec(cfg) -> DecoderSpec:
    if getattr(cfg, "clip_qkv", None) is not None:
        raise ValueError(f"olmoe with clip_qkv={cfg.clip_qkv} is not supported (clip_qkv: null only)")
    moe = MoeSpec(num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                  intermediate_size=cfg.intermediate_size, norm_top_k=cfg.norm_topk_prob,
                  float32_weights=False, sparse_layers=(True,) * cfg.num_hidden_layers)
    bias = bool(getattr(cfg, "attention_bias", False))
    return DecoderSpec(**attention_shape(cfg), intermediate_size=cfg.intermediate_size,
                       qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=False,
                       qk_norm_over_heads=True, moe=moe)


FAMILY = ModelFamily(
    name="OLMoE", model_types=("olmoe",), architectures=("OlmoeForCausalLM",),
    read_spec=read_spec, model_class=LlamaForCausalLM,
    tensor_parallel="no (q/k norms over all heads)", sliding_window="no", gguf="no")
