"""The Llama family: Llama, SmolLM, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm), Phi-3
(fused checkpoint weights); and the decoder the mixture-of-experts families (``mixtral.py``,
``qwen_moe.py``, ``olmoe.py``) share, whose sparse layers hold a ``moe.SparseMoeBlock``
where these hold a ``mlp.GatedMLP``.

The model works on one packed batch: ``input_ids`` and ``positions`` are flat
``[num_tokens]`` tensors holding every scheduled sequence's new tokens back to
back. It never sees block tables: attention goes through the backend with the
step's ``AttentionMetadata``. Projections are fused (qkv, gate+up) to keep the
number of kernel launches per layer small.

Under tensor parallelism (``tp.size > 1``) each rank builds the same model with
its share of heads, MLP channels and vocabulary (``sharding.ShardPlan``): two
all-reduces per layer (after ``o_proj`` and ``down_proj``), one in the
embedding, and the logits gathered to rank 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from ..executor.group import SINGLE, TensorParallelGroup
from .cpu_decoder_stack import CpuDecoderStack
from .elementwise import TORCH_OPS, FusedCpuOps, TorchOps
from .family import ModelFamily
from .layers import RMSNorm, RotaryEmbedding
from .mlp import GatedMLP
from .moe import SparseMoeBlock
from .parallel_layers import RowParallelLinear, VocabParallelEmbedding
from .sharding import ShardPlan
from .spec import DecoderSpec, attention_shape


class LlamaAttention(nn.Module):
    def __init__(self, spec: DecoderSpec, shard: ShardPlan, tp: TensorParallelGroup,
                 sliding_window: int | None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = shard.num_heads, shard.num_kv_heads, spec.head_dim
        self.q_size = shard.num_heads * spec.head_dim
        self.kv_size = shard.num_kv_heads * spec.head_dim
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, spec.hidden_size, spec.o_bias, tp)
        # q/k norms: per head (Qwen3), or over every head at once before q and k are cut into
        # heads (OLMoE; one rank holds every head then)
        self.qk_norm_over_heads = spec.qk_norm_over_heads
        q_width, k_width = ((self.q_size, self.kv_size) if spec.qk_norm_over_heads
                            else (spec.head_dim, spec.head_dim))
        has_norms = spec.qk_norm or spec.qk_norm_over_heads
        self.q_norm = RMSNorm(q_width, spec.rms_norm_eps) if has_norms else None
        self.k_norm = RMSNorm(k_width, spec.rms_norm_eps) if has_norms else None
        self.scale = spec.head_dim ** -0.5
        self.sliding_window = sliding_window
        self.logits_soft_cap: float | None = None  # Gemma 2 caps its attention scores
        self.ops = TORCH_OPS

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm_over_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and not self.qk_norm_over_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rotate(q, k, rope)
        k_cache, v_cache = kv_cache
        backend.write_kv(k, v, k_cache, v_cache, meta)
        out = backend.attend(q, k_cache, v_cache, meta, self.scale, self.sliding_window,
                             self.logits_soft_cap)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, spec: DecoderSpec, shard: ShardPlan, tp: TensorParallelGroup,
                 layer_index: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(spec, shard, tp, spec.sliding_windows[layer_index])
        if spec.is_sparse(layer_index):
            channels = shard.expert_channels
            self.mlp = SparseMoeBlock(spec, channels.stop - channels.start,
                                      shard.shared_expert_size, tp)
        else:
            self.mlp = GatedMLP(spec.hidden_size, shard.intermediate_size, spec.mlp_bias, tp)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Packed-batch forward over a paged KV cache; ``compute_logits`` on selected rows only.

    ``shard`` says which heads, channels and vocabulary rows this rank holds (all
    of them without tensor parallelism); the KV cache holds ``shard.num_kv_heads``.
    """

    layer_class: type[nn.Module] = LlamaDecoderLayer  # (spec, shard, tp, index) -> one layer
    norm_class: type[nn.Module] = RMSNorm  # (dim, eps) -> the final norm

    def __init__(self, spec: DecoderSpec, tp: TensorParallelGroup = SINGLE) -> None:
        super().__init__()
        self.spec = spec
        self.shard = shard = ShardPlan(spec, tp.rank, tp.size)
        self.tp = tp
        self.embed_tokens = VocabParallelEmbedding(shard.vocab_size, spec.hidden_size,
                                                   shard.vocab_start, tp)
        self.layers = nn.ModuleList(self.layer_class(spec, shard, tp, i)
                                    for i in range(spec.num_layers))
        self.norm = self.norm_class(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = None if spec.tie_word_embeddings else nn.Linear(
            spec.hidden_size, shard.vocab_size, bias=False)
        self.rotary: RotaryEmbedding | None = None  # set by attach_rotary
        self.ops = TORCH_OPS
        # True once projections are prepacked oneDNN linears: oneDNN builds a kernel per
        # distinct row count, so the runner then rounds batches up to a few bucketed sizes.
        self.prefers_bucketed_batches = False
        # All layers in one C++ call on CPU where possible (set by use_ops; see cpu_decoder_stack).
        self.decoder_stack: CpuDecoderStack | None = None

    def attach_rotary(self, hf_config, max_positions: int, dtype: torch.dtype,
                      device: torch.device) -> None:
        """Build the cos/sin tables (outside any meta-device context, once weights are real)."""
        self.rotary = RotaryEmbedding(hf_config, max_positions, dtype).to(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        residual = self.embed_tokens(input_ids)
        if self.decoder_stack is not None and self.decoder_stack.serves(backend, kv_caches):
            return self.decoder_stack(residual, positions, kv_caches, meta)
        rope = self.ops.rope_tables(self.rotary, positions)
        hidden = self.layers[0].input_layernorm(residual)
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, kv_cache, next_norm in zip(self.layers, kv_caches, next_norms):
            attn_out = layer.self_attn(hidden, rope, kv_cache, meta, backend)
            residual, hidden = layer.post_attention_layernorm.add_and_norm(residual, attn_out)
            residual, hidden = next_norm.add_and_norm(residual, layer.mlp(hidden))
        return hidden  # the final norm of the last residual

    def use_ops(self, ops: TorchOps | FusedCpuOps) -> None:
        """Route every elementwise step (norms, rotary, SiLU-and-mul) through ``ops``; the last
        step of making a model ready (after packing): with fused CPU ops, the layers then run
        as one C++ call where they qualify (``cpu_decoder_stack``)."""
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = ops
        self.decoder_stack = CpuDecoderStack.for_model(self) if self.rotary is not None else None

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph can capture the forward: no step reads a device value on the
        host (MoE routing does: it counts each expert's tokens on the host)."""
        return self.spec.moe is None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits ``[rows, vocab_size]`` on rank 0; ``None`` on the other ranks."""
        if self.lm_head is None:  # tied to the embedding
            local = F.linear(hidden, self.embed_tokens.weight)
        else:
            local = self.lm_head(hidden)
        logits = self.tp.gather_to_driver(local)
        return None if logits is None else logits[:, :self.spec.vocab_size]

    def pack_for_cpu(self, compute_dtype: torch.dtype) -> None:
        """Switch every projection, the (tied) LM head included, to prepacked weights that
        compute in ``compute_dtype`` (see ``cpu_linear``)."""
        from .cpu_linear import PackedLinear, pack_linear_layers, packed_linear
        pack_linear_layers(self, compute_dtype)
        self.decoder_stack = None  # it held the unpacked weights: use_ops builds it again
        if self.lm_head is None:
            self.lm_head = packed_linear(self.embed_tokens.weight, None, compute_dtype)
        # oneDNN builds a kernel per row count: steps then keep to a few (bucketed_num_tokens)
        self.prefers_bucketed_batches = any(isinstance(m, PackedLinear) for m in self.modules())

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face weights in (this rank's slices, ``shard.slice_of``), fusing q/k/v
        and gate/up projections; vocabulary slices shorter than the shard are zero-padded;
        experts go to their block (``SparseMoeBlock.load_expert_weight``)."""
        own = dict(self.named_parameters())
        fused: dict[str, list[torch.Tensor]] = {}
        loaded: set[str] = set()
        for hf_name, tensor in self._unfused(tensors):
            name = _canonical_name(hf_name)
            if "rotary_emb" in name:
                continue
            if ".mlp.experts." in name:
                layer, expert_name = name.split(".mlp.experts.")
                block = self.get_submodule(f"{layer}.mlp")
                param = block.load_expert_weight(expert_name, tensor, self.shard.expert_channels)
                loaded.add(f"{layer}.mlp.experts.{param}")
                continue
            for part, target in _FUSED_PARTS.items():
                if f".{part}." in name:
                    fused.setdefault(name.replace(part, target), []).append((_PART_ORDER[part], tensor))
                    break
            else:
                if name not in own:
                    if name == "lm_head.weight" and self.lm_head is None:
                        continue  # tied to the embedding
                    raise ValueError(f"unexpected weight {hf_name!r} in checkpoint")
                if name in _VOCAB_ROWS:
                    _copy_padded(own[name].data, tensor)
                else:
                    own[name].data.copy_(tensor)
                loaded.add(name)
        for name, parts in fused.items():
            own[name].data.copy_(torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])], dim=0))
            loaded.add(name)
        missing = set(own) - loaded
        if missing:
            raise ValueError(f"checkpoint lacks weights: {sorted(missing)[:5]}")


    def _unfused(self, tensors: dict[str, torch.Tensor]):
        """``(name, tensor)`` of the checkpoint, with fused ``qkv_proj`` / ``gate_up_proj``
        weights (Phi-3's) split into the parts other checkpoints store (``q_proj``, ...), each
        cut to this rank's slice (``shard.slice_of``), so one path loads both layouts."""
        spec = self.spec
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        splits = {"qkv_proj": (("q_proj", q), ("k_proj", kv), ("v_proj", kv)),
                  "gate_up_proj": (("gate_proj", spec.intermediate_size),
                                   ("up_proj", spec.intermediate_size))}
        for name, tensor in tensors.items():
            fused = next((f for f in splits if f".{f}." in name), None)
            if fused is None:
                yield name, tensor
                continue
            parts = splits[fused]
            for (part, _), piece in zip(parts, tensor.split([size for _, size in parts], dim=0)):
                part_name = name.replace(fused, part)
                index = self.shard.slice_of(part_name, tuple(piece.shape))
                yield part_name, piece if index is None else piece[index]


def _canonical_name(hf_name: str) -> str:
    """A checkpoint name as this model names it: no ``model.`` prefix, and Mixtral's older
    ``block_sparse_moe`` for ``mlp``."""
    return hf_name.removeprefix("model.").replace(".block_sparse_moe.", ".mlp.")


def _copy_padded(param: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy ``tensor`` into the leading rows of ``param``; rows past it (vocabulary padding) are 0."""
    if tensor.shape[0] < param.shape[0]:
        param.zero_()
    param[:tensor.shape[0]].copy_(tensor)


_VOCAB_ROWS = ("embed_tokens.weight", "lm_head.weight")
_FUSED_PARTS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
_PART_ORDER = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}


def read_spec(cfg) -> DecoderSpec:
    """The Llama family's ``DecoderSpec`` (Qwen2's qkv bias, Qwen3's q/k norms)."""
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    return DecoderSpec(
        **attention_shape(cfg), intermediate_size=cfg.intermediate_size,
        qkv_bias=attention_bias or cfg.model_type == "qwen2",
        o_bias=attention_bias and cfg.model_type == "llama",
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)), qk_norm=cfg.model_type == "qwen3")


FAMILY = ModelFamily(
    name="Llama", model_types=("llama", "mistral", "qwen2", "qwen3", "phi3"),
    architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                   "Qwen3ForCausalLM", "Phi3ForCausalLM"),
    read_spec=read_spec, model_class=LlamaForCausalLM, tensor_parallel="yes",
    sliding_window="yes (Mistral, Qwen2/3 use_sliding_window, Phi-3)", gguf="yes")
