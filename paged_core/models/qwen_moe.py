"""Qwen2-MoE and Qwen3-MoE: Qwen2's (qkv bias) or Qwen3's (q/k norm per head) attention
with sparse mixture-of-experts MLPs (``moe.py``) in the layers ``decoder_sparse_step`` and
``mlp_only_layers`` pick (dense ``GatedMLP`` elsewhere); probabilities renormalised where
``norm_topk_prob`` says, cast to the model's dtype. Qwen2-MoE adds a shared expert every
token runs, scaled by ``sigmoid(shared_expert_gate(x))``."""
from __future__ import annotations

from .family import ModelFamily
from .llama import LlamaForCausalLM
from .spec import DecoderSpec, MoeSpec, attention_shape


def sparse_layers(cfg) -> tuple[bool, ...]:
    """Per layer: a mixture of experts (True) or a dense MLP, as transformers decides."""
    dense = set(getattr(cfg, "mlp_only_layers", None) or ())
    step = getattr(cfg, "decoder_sparse_step", 1) or 1
    return tuple(i not in dense and cfg.num_experts > 0 and (i + 1) % step == 0
                 for i in range(cfg.num_hidden_layers))


def read_spec(cfg) -> DecoderSpec:
    qwen2 = cfg.model_type == "qwen2_moe"
    moe = MoeSpec(num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                  intermediate_size=cfg.moe_intermediate_size, norm_top_k=cfg.norm_topk_prob,
                  float32_weights=False, sparse_layers=sparse_layers(cfg),
                  shared_expert_size=cfg.shared_expert_intermediate_size if qwen2 else 0)
    bias = bool(getattr(cfg, "qkv_bias" if qwen2 else "attention_bias", False))
    return DecoderSpec(**attention_shape(cfg), intermediate_size=cfg.intermediate_size,
                       qkv_bias=bias, o_bias=bias and not qwen2, mlp_bias=False,
                       qk_norm=not qwen2, moe=moe)


FAMILY = ModelFamily(
    name="Qwen MoE", model_types=("qwen2_moe", "qwen3_moe"),
    architectures=("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"), read_spec=read_spec,
    model_class=LlamaForCausalLM, tensor_parallel="yes (each expert's width split)",
    sliding_window="yes (use_sliding_window, layer_types)",
    gguf="Qwen3-MoE yes; Qwen2-MoE refused (transformers misreads its shared expert)")
