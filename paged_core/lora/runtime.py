"""``LoRARuntime``: one rank's LoRA state: the wrapped projections, the ``max_loras`` slots they
hold, and a host cache of ``max_cpu_loras`` adapters read from disk (least recently used out).

``attach`` wraps every decoder layer's ``qkv_proj``, ``o_proj`` and (dense layers')
``gate_up_proj`` / ``down_proj`` in ``LoRALinear``. Before each step ``prepare`` copies the
adapters the core assigned to slots in (``PackedBatch.lora_loads``) and gives the wrappers
each row's slot (``PackedBatch.lora_slots``). The products run as the model's elementwise ops
do (``products.select_products``: C++ on a CPU, Triton on CUDA). The CPU's one-call decoder
stack (which holds the base weights, not the wrappers) is given every wrapper's slot tables
and the step's rows, and calls the same C++ products itself. Fused checkpoint modules (Phi-3's ``qkv_proj``, ``gate_up_proj``)
are split into the modules they fuse, sharing one ``lora_A``, so every module is sharded like
the base weight it adapts (``ShardPlan.slice_of``).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from ..executor.packed_batch import PackedBatch
from .layers import LoRALinear, ModulePart, PartWeights
from .peft_checkpoint import LoRAAdapter, LoRAModule, load_adapter, module_shapes
from .products import LoRABatch, select_products
from .request import LoRARequest

# a fused checkpoint module -> the modules it fuses, in output order
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class LoRARuntime:
    def __init__(self, model, max_loras: int, max_lora_rank: int, max_cpu_loras: int) -> None:
        self.model = model
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.batch = LoRABatch()
        self.device = model.embed_tokens.weight.device
        self.wrappers: list[tuple[int, str, LoRALinear]] = []  # (layer, projection, wrapper)
        self._cache: OrderedDict[LoRARequest, LoRAAdapter] = OrderedDict()
        self._stack = model.decoder_stack  # the base model's one-call CPU path, if any
        self._attach(max_loras)
        if self._stack is not None:
            for index, name, wrapper in self.wrappers:
                self._stack.set_lora(index, name, wrapper.a, wrapper.b_t, wrapper.part_starts)
            self._stack.lora_batch = self.batch

    def _attach(self, max_loras: int) -> None:
        model = self.model
        shard, tp = model.shard, model.tp
        hidden = model.spec.hidden_size
        row_parallel = tp.size > 1
        products = select_products(model.ops)
        dtype = products.table_dtype(model.embed_tokens.weight.dtype, self.device)

        def wrap(owner, attr: str, parts: list[ModulePart], width_in: int, row: bool) -> None:
            wrapper = LoRALinear(getattr(owner, attr), parts, width_in, self.batch, max_loras,
                                 self.max_lora_rank, tp, row and row_parallel, dtype,
                                 self.device, products)
            setattr(owner, attr, wrapper)
            self.wrappers.append((index, attr, wrapper))

        for index, layer in enumerate(model.layers):
            attn = layer.self_attn
            q, kv = attn.q_size, attn.kv_size
            wrap(attn, "qkv_proj", [ModulePart("q_proj", 0, q), ModulePart("k_proj", q, kv),
                                    ModulePart("v_proj", q + kv, kv)], hidden, row=False)
            wrap(attn, "o_proj", [ModulePart("o_proj", 0, hidden)], q, row=True)
            if not model.spec.is_sparse(index):
                width = shard.intermediate_size
                wrap(layer.mlp, "gate_up_proj", [ModulePart("gate_proj", 0, width),
                                                 ModulePart("up_proj", width, width)],
                     hidden, row=False)
                wrap(layer.mlp, "down_proj", [ModulePart("down_proj", 0, hidden)], width,
                     row=True)

    def adapter(self, request: LoRARequest) -> LoRAAdapter:
        """``request``'s adapter from the host cache, read from disk on a miss."""
        if request in self._cache:
            self._cache.move_to_end(request)
            return self._cache[request]
        adapter = load_adapter(request, self.model.spec, self.max_lora_rank)
        self._cache[request] = adapter
        while len(self._cache) > self.max_cpu_loras:
            self._cache.popitem(last=False)
        return adapter

    def prepare(self, packed: PackedBatch) -> None:
        """Load the step's newly assigned adapters into their slots; group its rows by slot."""
        for slot, request in packed.lora_loads:
            self._load(slot, _unfused(self.adapter(request), self.model.spec))
        slots = packed.lora_slots
        self.batch.token_slots = (None if slots is None or not (slots >= 0).any() else
                                  torch.from_numpy(slots).to(self.device))

    def _load(self, slot: int, modules: dict[tuple[int, str], LoRAModule]) -> None:
        shard = self.model.shard
        for index, name, wrapper in self.wrappers:
            weights = {}
            for part in wrapper.parts:
                module = modules.get((index, part.name))
                if module is None:
                    continue
                a, b = module.a, module.b
                cut = shard.slice_of(f"layers.{index}.{part.name}.weight", tuple(
                    (a if wrapper.row_parallel else b).shape))
                if cut is not None:  # column-parallel: b's rows; row-parallel: a's columns
                    a, b = (a[cut], b) if wrapper.row_parallel else (a, b[cut])
                weights[part.name] = PartWeights(a.to(self.device), b.to(self.device),
                                                 module.scaling)
            wrapper.set_slot(slot, weights)
            if self._stack is not None:
                self._stack.set_lora_width(index, name, slot, wrapper.widths.values[slot])


def _unfused(adapter: LoRAAdapter, spec) -> dict[tuple[int, str], LoRAModule]:
    """The adapter's modules with fused ones split (each part keeps the shared ``a``)."""
    widths = module_shapes(spec)
    modules = {}
    for (layer, name), module in adapter.modules.items():
        parts = _FUSED.get(name, (name,))
        rows = module.b.split([widths[part][1] for part in parts])
        for part, b in zip(parts, rows):
            modules[(layer, part)] = LoRAModule(module.a, b.contiguous(), module.scaling)
    return modules
