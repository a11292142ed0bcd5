"""``ModelRunner``: owns one rank's model and KV cache tensors; runs one packed forward per step.

Input: a ``PackedBatch`` (see ``packed_batch``: every scheduled sequence's new
tokens back to back, with positions, ``slot_mapping``, ``block_tables``,
``seq_lens``) and the step's copy-on-write block copies. It runs the model
once and returns logits only for the rows that are sampled. Under tensor
parallelism every rank runs the same packed batch on its shard; only rank 0
gets logits.

When the model asks for it (``prefers_bucketed_batches``: prepacked oneDNN
linears, which build a kernel for every new row count, ~0.4 ms per layer the
first time), the driver packs batches padded up to a bucketed token count
(padding rows: token 0, position 0, slot -1), so a long-running server sees ~80
distinct shapes instead of up to ``max_num_batched_tokens`` of them.
"""
from __future__ import annotations

import torch

from ..attention import AttentionBackend, AttentionMetadata
from ..attention.kv_quant import kv_cache_row, kv_cache_row_bytes
from ..cpu.huge_pages import zeros_on_huge_pages
from ..cpu.openmp_spin import warn_if_threads_sleep
from ..models.llama import LlamaForCausalLM
from .cuda_graphs import StepGraphs
from .packed_batch import PackedBatch


def kv_cache_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
    """K and V of one block in every layer, for this rank's KV heads, in cache ``dtype``
    (a quantized one counts its rows' scales: ``kv_quant``)."""
    spec = model.spec
    row = kv_cache_row_bytes(spec.head_dim, dtype)
    return 2 * spec.num_layers * block_size * model.shard.num_kv_heads * row


def _zeros_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One layer's K or V cache; on the CPU in huge pages (``huge_pages``)."""
    if device.type == "cpu":
        return zeros_on_huge_pages(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


class ModelRunner:
    """``cache_dtype`` is the KV cache tensors' dtype: the model's, or a quantized one whose
    rows carry their scales (``attention.kv_quant``; the backends read both)."""

    def __init__(self, model: LlamaForCausalLM, backend: AttentionBackend, num_blocks: int,
                 block_size: int, device: torch.device, cache_dtype: torch.dtype) -> None:
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.device = device
        if device.type == "cpu":
            warn_if_threads_sleep()
        shape = backend.kv_cache_shape(num_blocks, block_size, model.shard.num_kv_heads,
                                       kv_cache_row(model.spec.head_dim, cache_dtype))
        self.kv_caches = [(_zeros_cache(shape, cache_dtype, device),
                           _zeros_cache(shape, cache_dtype, device))
                          for _ in range(model.spec.num_layers)]
        self.cuda_graphs: StepGraphs | None = None
        self.lora = None  # a LoRARuntime when enable_lora (set by the worker)
        # async_scheduling (set by the worker): host-to-device copies of a step's inputs do not
        # wait for the device (a blocking copy waits for every kernel queued before it, so
        # the sampled rows' indices, copied after the forward, would hold the host until the
        # forward ends). Safe from numpy's pageable memory: CUDA stages such a copy before the
        # call returns.
        self.non_blocking_inputs = False

    def capture_cuda_graphs(self, max_num_seqs: int, max_model_len: int, max_capture_size: int,
                            max_mixed_tokens: int = 0) -> None:
        """Capture the forward as CUDA graphs (``cuda_graphs``): decode steps of up to
        ``max_capture_size`` sequences, and with ``max_mixed_tokens`` the other steps of up to
        that many tokens; steps that fit one replay it from then on."""
        graphs = StepGraphs(self.model, self.backend, self.kv_caches, max_num_seqs,
                            max_model_len, self.block_size, self.device, max_capture_size,
                            max_mixed_tokens)
        graphs.capture()
        self.cuda_graphs = graphs

    @torch.inference_mode()
    def execute(self, packed: PackedBatch,
                block_copies: list[tuple[int, int]]) -> torch.Tensor | None:
        """Run one step; returns the logits ``[rows needing logits, vocab]`` in batch order, in
        the LM head's dtype (the sampler widens them where it needs float32), on rank 0
        (``None`` on the other ranks of a tensor-parallel group)."""
        if block_copies:
            src, dst = zip(*block_copies)
            self.backend.copy_blocks([k for k, _ in self.kv_caches], [v for _, v in self.kv_caches],
                                     torch.tensor(src, device=self.device),
                                     torch.tensor(dst, device=self.device))
        if self.lora is not None:
            self.lora.prepare(packed)
        hidden = None if self.cuda_graphs is None else self.cuda_graphs.run(packed)
        if hidden is None:
            input_ids, rope_rows, meta = self._device_inputs(packed)  # positions: rotary's
            if packed.ahead is not None:
                packed.ahead.write_into(input_ids)
            hidden = self.model(input_ids, rope_rows, self.kv_caches, meta, self.backend)
        return self.model.compute_logits(self._sampled_rows(hidden, packed.logits_indices))

    def _sampled_rows(self, hidden: torch.Tensor, logits_indices) -> torch.Tensor:
        """The rows of ``hidden`` whose logits the step needs. ``logits_indices`` increase, so
        as many of them as rows are every row in order (a decode step where every sequence
        samples): then ``hidden`` itself, without a gather."""
        if len(logits_indices) == hidden.shape[0]:
            return hidden
        return hidden[self._to_device(logits_indices)]

    def _to_device(self, array) -> torch.Tensor:
        """A step's host array as a tensor on the model's device (on the CPU, the array's own
        memory: no copy and no ``to`` call)."""
        tensor = torch.from_numpy(array)
        if self.device.type == "cpu":
            return tensor
        return tensor.to(self.device, non_blocking=self.non_blocking_inputs)

    def _device_inputs(self, packed: PackedBatch):
        to = self._to_device
        meta = AttentionMetadata(
            slot_mapping=to(packed.slot_mapping),
            block_tables=to(packed.block_tables),
            seq_lens=to(packed.seq_lens),
            query_start_loc=to(packed.query_start_loc),
            max_query_len=packed.max_query_len,
            max_seq_len=int(packed.seq_lens.max()),
            seq_lens_cpu=packed.seq_lens.tolist(),
            query_lens_cpu=packed.query_lens.tolist(),
        )
        return to(packed.input_ids), to(packed.rope_rows), meta
