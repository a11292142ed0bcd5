"""Every decoder layer of a CPU Llama-family model in one C++ call per step.

A one-sequence decode step of a 30-layer model runs ~400 small ops; from Python
each costs microseconds of interpreter and dispatch work, which on a 2-core CPU
was a third of such a step. ``CpuDecoderStack`` hands the layers' weights (shared,
not copied) to ``DecoderStack`` (``paged_core/cpu/csrc/decoder_stack.cpp``), which runs
the very kernels of the Python path in the same order, so both give the same bits.

It serves a model only where the Python path would run exactly those kernels
(``CpuDecoderStack.for_model`` returns ``None`` otherwise, and the model keeps its
Python layers): one rank, the fused C++ ops of a CPU level, dense MLPs (no experts) and
per-head q/k norms at most, every projection a
plain ``nn.Linear``, one that ``cpu_linear.packed_linear`` built or a weight-only 4- or
8-bit ``Int4Linear`` / ``Int8Linear``, a ``W8A8Linear`` or a ``W4A8Linear`` (whose levels the stack multiplies
with the same C++ kernels and thresholds, ``set_quantized``; batch-invariant tiling and
tensor-parallel layers keep Python), and per step (``serves``) an attention
backend that sends these caches to the C++ kernel of the same level.

LoRA adapters run inside it too: ``set_lora`` hands it a projection's slot tables (those of
``lora.layers.LoRALinear``, shared) and ``lora_batch`` is the runtime's ``LoRABatch``, whose
rows' slots each step passes along, so the stack adds the very products ``LoRALinear`` would
(the same C++ functions).
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata
from ..attention.cpu_kernels import bf16_attention_amx
from ..cpu.kv_prefetch import kv_first_line
from ..quantization.int4_linear import Int4Linear
from ..quantization.int8_linear import Int8Linear
from ..quantization.w4a8_linear import W4A8Linear
from ..quantization.w8a8_linear import W8A8Linear
from .bf16_dot_linear import Bf16DotLinear
from .cpu_linear import PACKED_LINEARS
from .elementwise import FusedCpuOps
from .mlp import GatedMLP
from .parallel_layers import RowParallelLinear


class CpuDecoderStack:
    """The decoder layers of one model as a ``torch.classes.paged_core_cpu_<level>.DecoderStack``."""

    def __init__(self, model: nn.Module, cpu_isa: str) -> None:
        from ..cpu.extension import ops_namespace

        spec = model.spec
        self.cpu_isa = cpu_isa
        self.amx_tiles = bf16_attention_amx(cpu_isa)  # the attention's, as the backend's
        self.dtype = model.norm.weight.dtype  # the activations' (the final norm runs in C++)
        stack_class = getattr(torch.classes, ops_namespace(cpu_isa)).DecoderStack
        first = model.layers[0].self_attn
        self._stack = stack_class(first.num_heads, first.num_kv_heads, first.head_dim,
                                  spec.rms_norm_eps, first.scale, model.rotary.cos,
                                  model.rotary.sin, model.norm.weight, self.amx_tiles,
                                  kv_first_line())
        for layer in model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self._stack.add_layer(
                layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                None if attn.q_norm is None else attn.q_norm.weight,
                None if attn.k_norm is None else attn.k_norm.weight,
                *_weight_and_bias(attn.qkv_proj), *_weight_and_bias(attn.o_proj),
                *_weight_and_bias(mlp.gate_up_proj), *_weight_and_bias(mlp.down_proj),
                [_bf16_dot_out_features(p) for p in
                 (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)],
                _amx_min_rows((attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)),
                attn.sliding_window or 0)
        for index, layer in enumerate(model.layers):
            for projection in PROJECTIONS:
                module = _projection(layer, projection)
                if type(module) in QUANTIZED_LINEARS:
                    self._set_quantized(index, projection, module)
        self.lora_batch = None  # the LoRA runtime's LoRABatch (this step's rows per slot)

    @classmethod
    def for_model(cls, model: nn.Module) -> CpuDecoderStack | None:
        """A stack for ``model`` (loaded, packed and given its ops) if it qualifies (see the
        module doc), else ``None``."""
        if not isinstance(model.ops, FusedCpuOps) or model.tp.size != 1:
            return None
        if any(type(layer.mlp) is not GatedMLP or layer.self_attn.qk_norm_over_heads
               for layer in model.layers):  # experts, or q/k norms over all heads
            return None
        projections = [proj for layer in model.layers
                       for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                    layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        if not all(type(p) in _STACKED_PROJECTIONS for p in projections):
            return None
        return cls(model, model.ops.cpu_isa)

    def _set_quantized(self, layer: int, projection: str, module: nn.Module) -> None:
        """Hand the stack ``module``'s levels (shared): it then runs that projection as
        ``QuantizedLinear.forward`` does."""
        self._stack.set_quantized(
            layer, PROJECTIONS.index(projection), module.bits,
            module.levels, module.scales, module.offsets, module.zeros, module.group_size,
            module.dense_rows, module.dense_dtype, module.column_outputs, module.amx_min_rows,
            module.int8_tile_rows, module.row_dense, *_int8_activations(module))

    def set_lora(self, layer: int, projection: str, a: torch.Tensor, b_t: torch.Tensor,
                 part_starts: list[int]) -> None:
        """Give ``projection`` (a name of ``PROJECTIONS``) of ``layer`` its LoRA slot tables
        and its parts' output column boundaries."""
        self._stack.set_lora(layer, PROJECTIONS.index(projection), a, b_t, part_starts)

    def set_lora_width(self, layer: int, projection: str, slot: int, width: int) -> None:
        """The columns of its tables that the adapter now in ``slot`` uses (0: none)."""
        self._stack.set_lora_width(layer, PROJECTIONS.index(projection), slot, width)

    def serves(self, backend: AttentionBackend, kv_caches: list[tuple[torch.Tensor, ...]]) -> bool:
        """True if this step's attention would run the C++ kernel of this stack's level and
        tiles (over caches in the model dtype or quantized: the stack stores K/V with the
        backend's own C++ write, ``write_kv_slots``, so both paths store the same bits)."""
        k_cache = kv_caches[0][0]
        return (getattr(backend, "cpu_isa", None) == self.cpu_isa
                and getattr(backend, "amx_tiles", False) == self.amx_tiles
                and getattr(backend, "decode_loop", True)  # the stack's attention takes it
                and backend.uses_cpu_kernel(k_cache.device, self.dtype, k_cache.dtype))

    def __call__(self, residual: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 meta: AttentionMetadata) -> torch.Tensor:
        """The final-normed hidden states of the step; ``residual`` (the embedded tokens) is
        used as the residual stream (updated in place)."""
        token_slots = self.lora_batch.token_slots if self.lora_batch is not None else None
        return self._stack.forward(residual, positions, [k for k, _ in kv_caches],
                                   [v for _, v in kv_caches], meta.slot_mapping,
                                   meta.num_scheduled_tokens, meta.block_tables, meta.seq_lens,
                                   meta.query_start_loc, token_slots)


def _projection(layer: nn.Module, name: str) -> nn.Module:
    """Projection ``name`` (of ``PROJECTIONS``) of a decoder layer."""
    return getattr(layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp, name)


def _weight_and_bias(projection: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight the C++ projection multiplies by (packed or plain; a quantized one's
    levels, which ``set_quantized`` then tells the stack how to read) and its bias."""
    if type(projection) in QUANTIZED_LINEARS:
        return projection.levels, projection.bias
    if isinstance(projection, PACKED_LINEARS):
        return projection.packed_weight, projection.bias
    return projection.weight, projection.bias


def _bf16_dot_out_features(projection: nn.Module) -> int:
    """What the C++ stack needs to run a ``Bf16DotLinear``: its out_features (else 0)."""
    return projection.out_features if isinstance(projection, Bf16DotLinear) else 0


def _amx_min_rows(projections: tuple[nn.Module, ...]) -> int:
    """The ``amx_min_rows`` of the layer's ``Bf16DotLinear`` projections (0 without any; one
    load gives every projection the same)."""
    return next((p.amx_min_rows for p in projections if isinstance(p, Bf16DotLinear)), 0)


# The projections of a layer, in the C++ stack's order.
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")

# Quantized linears the stack runs itself (exactly these types; W8A8Linear and W4A8Linear
# quantize their inputs first, as the stack's products do).
QUANTIZED_LINEARS = (Int4Linear, Int8Linear, W8A8Linear, W4A8Linear)


def _int8_activations(module: nn.Module) -> tuple:
    """``set_quantized``'s last three arguments for ``module``: from how many rows its sums are
    integer (-1: weight-only, its inputs never quantized), W8A8's vnni sums and W4A8's packed
    outputs (0: not ``w4a8_pack``'s layout)."""
    if type(module) is W8A8Linear:
        return module.int8_sums_from_rows, module.vnni_sums, 0
    if type(module) is W4A8Linear:
        return module.int8_sums_from_rows, None, module.w4a8_outputs
    return -1, None, 0

# Exactly these types (subclasses may compute otherwise); a RowParallelLinear of one rank
# is a plain nn.Linear.
_STACKED_PROJECTIONS = (nn.Linear, RowParallelLinear, *PACKED_LINEARS, *QUANTIZED_LINEARS)
