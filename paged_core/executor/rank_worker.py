"""``Worker``: one rank's model shard, KV cache and runner; ``worker_main``: a non-driver rank's life.

Every rank builds a ``Worker`` the same way: load its slice of the weights,
size its KV cache, agree with the other ranks on one block count (the
smallest, so block ids mean the same on every rank). The driver (rank 0)
then calls ``execute_model`` once per step after broadcasting the step
(``broadcast_step``); every other rank runs ``serve_steps``: receive the step,
run the same forward (its part of every collective), until the driver
broadcasts ``None`` (shut down).

A non-driver rank never outlives its parent: ``watch_parent`` ends it when the
process that started it is gone (also when that one was killed with SIGKILL).
An exception in a worker is logged with its traceback and ends the process,
which closes its sockets, so the driver's pending collective fails at once.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..attention import select_backend
from ..attention.kv_quant import cache_dtype
from ..attention.torch_backend import TorchAttentionBackend
from ..config import EngineConfig
from ..cpu.extension import cpu_extension_available, cpu_extension_error
from ..models.embedded_model import embedded_gguf_path
from ..lora.runtime import LoRARuntime
from ..models.model_loader import load_hf_config, load_model
from ..sample.sampler import Sampler
from ..sample.sampling_plan import SamplerOutput, SamplingPlan
from .model_runner import ModelRunner, kv_cache_bytes_per_block
from .packed_batch import PackedBatch
from .group import TensorParallelGroup, all_ranks_loaded, init_process_group, rank_device

logger = logging.getLogger("paged_core.worker")

_CPU_DEFAULT_KV_BYTES = 1 << 30


@dataclass(frozen=True)
class RankSpec:
    """What a rank needs to build its ``Worker``. Sent pickled to local worker processes, which
    are fresh interpreters: nothing in it may be defined in ``__main__`` (``launch`` refuses it)."""

    config: EngineConfig
    folder: str
    max_model_len: int
    device: torch.device
    dtype: torch.dtype


def _quantized_gguf(config) -> str | None:
    """The GGUF file whose quantized projections stay quantized (``quantization='gguf'``),
    else None."""
    if config.quantization != "gguf":
        return None
    return config.model or embedded_gguf_path()


def for_rank(spec: RankSpec, rank: int) -> RankSpec:
    """``spec`` with rank ``rank``'s device (its own GPU; the CPU is shared)."""
    return replace(spec, device=rank_device(spec.device, rank))


class Worker:
    def __init__(self, spec: RankSpec, tp: TensorParallelGroup) -> None:
        config = spec.config
        self.tp = tp = replace(tp, fixed_order_sums=config.batch_invariant)
        backend = select_backend(config.attention_backend, spec.device)
        if config.batch_invariant:
            _require_invariant_attention(backend, spec.device, spec.dtype)
            backend.decode_loop = False  # every query on the kernel's tiles
        hf_config = load_hf_config(spec.folder)
        model = load_model(spec.folder, hf_config, spec.max_model_len, spec.dtype, spec.device, tp,
                           batch_invariant=config.batch_invariant, gguf_file=_quantized_gguf(config))
        kv_dtype = cache_dtype(config.kv_cache_dtype, spec.dtype)  # attention.kv_quant
        num_blocks = _agree_on_min(tp, kv_cache_num_blocks(config, model, spec.device, kv_dtype))
        self.runner = ModelRunner(model, backend, num_blocks, config.block_size, spec.device,
                                  kv_dtype)
        self.runner.non_blocking_inputs = config.async_scheduling
        if config.enable_lora:
            self.runner.lora = LoRARuntime(model, config.max_loras, config.max_lora_rank,
                                           config.max_cpu_loras)
        if uses_cuda_graphs(config, spec.device, tp, model):
            mixed = (min(config.max_cudagraph_capture_size, config.max_num_batched_tokens)
                     if config.cudagraph_mode == "FULL" else 0)
            self.runner.capture_cuda_graphs(config.max_num_seqs, spec.max_model_len,
                                            config.max_cudagraph_capture_size, mixed)
        self.num_blocks = num_blocks
        self.sampler = Sampler(torch.Generator().manual_seed(config.seed))  # draws on the CPU
        all_ranks_loaded(tp)

    def execute_model(self, packed: PackedBatch, block_copies: list[tuple[int, int]],
                      plan: SamplingPlan | None = None) -> SamplerOutput | None:
        """Run this rank's shard of the step; on the driver (rank 0, the only rank that gets
        the ``plan``), sample it too."""
        logits = self.runner.execute(packed, block_copies)
        return None if plan is None else plan.run(self.sampler, logits)


def _require_invariant_attention(backend, device: torch.device, dtype: torch.dtype) -> None:
    """Batch-invariant mode needs the C++ CPU attention kernel (each query reduced over its
    own keys in a fixed order); the other attention paths pad or split by batch."""
    if isinstance(backend, TorchAttentionBackend) and backend.uses_cpu_kernel(device, dtype):
        return
    reason = "" if cpu_extension_available() else f" (the kernel does not build here: " \
                                                   f"{cpu_extension_error()})"
    raise ValueError(
        f"batch_invariant=True needs the CPU paged-attention kernel: device cpu, dtype float32 "
        f"or bfloat16, attention_backend 'auto' or 'torch'; got device {device.type}, dtype "
        f"{str(dtype).removeprefix('torch.')}, attention backend {backend.name}{reason}")


def uses_cuda_graphs(config: EngineConfig, device: torch.device, tp: TensorParallelGroup,
                     model) -> bool:
    """Steps run as CUDA graphs on one CUDA rank unless ``enforce_eager`` (or
    ``cudagraph_mode="NONE"``), for models a graph can capture (``LlamaForCausalLM.capturable``; MoE models run eagerly) without LoRA
    (its rows per adapter change every step)."""
    wanted = device.type == "cuda" and not config.enforce_eager \
        and config.cudagraph_mode != "NONE"
    possible = tp.size == 1 and model.capturable and not config.enable_lora
    if wanted and not possible:
        logger.info("decode runs eagerly: CUDA graphs need one rank (tensor_parallel_size=%d), "
                    "no LoRA and a model without MoE routing on the host", tp.size)
    return wanted and possible


def activation_reserve(config: EngineConfig, model) -> int:
    """Bytes kept out of the GPU KV budget for one step's activations, an upper estimate:
    twice the widest live tensors of a layer over ``max_num_batched_tokens`` rows (residual,
    normed input, q/k/v, attention output, gate/up and their product), float32 logits of
    ``max_num_seqs`` rows three times over (logits, their float copy, the sampler's), and
    256 MiB for the CUDA graph pool and allocator rounding."""
    shard, spec = model.shard, model.spec
    q_kv = (shard.num_heads + 2 * shard.num_kv_heads) * spec.head_dim
    per_token = 4 * spec.hidden_size + 2 * q_kv + 3 * shard.intermediate_size
    element = model.embed_tokens.weight.element_size()
    logits = 3 * config.max_num_seqs * spec.vocab_size * 4
    return 2 * config.max_num_batched_tokens * per_token * element + logits + (256 << 20)


def kv_cache_num_blocks(config: EngineConfig, model, device: torch.device,
                        dtype: torch.dtype) -> int:
    """Blocks for this rank: ``num_kv_blocks``, else ``kv_cache_memory`` (per rank) over the
    bytes of one block of this rank's KV heads in cache ``dtype`` (quantized rows with their
    scales: int8 fits ~2x the blocks of bfloat16), else on a GPU the share of its memory that
    ``gpu_memory_utilization`` leaves once the weights are loaded and one step's activations
    are set aside (``activation_reserve``), else 1 GiB."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = kv_cache_bytes_per_block(model, config.block_size, dtype)
    if config.kv_cache_memory is not None:
        budget = config.kv_cache_memory
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(free - total * (1 - config.gpu_memory_utilization)
                     - activation_reserve(config, model))
    else:
        budget = _CPU_DEFAULT_KV_BYTES
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(
            f"the KV cache budget ({budget} bytes) is smaller than one block "
            f"({per_block} bytes for block_size={config.block_size}); raise kv_cache_memory "
            f"or gpu_memory_utilization")
    return num_blocks


def _agree_on_min(tp: TensorParallelGroup, value: int) -> int:
    if tp.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast_step(tp: TensorParallelGroup, step: tuple | None) -> tuple | None:
    """Rank 0 sends ``(packed, block_copies)`` (or ``None``: shut down); the others receive it."""
    box = [step]
    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend() == "nccl" else None
    dist.broadcast_object_list(box, src=0, device=device)
    return box[0]


def serve_steps(worker: Worker) -> None:
    """A non-driver rank's loop: run each broadcast step until the driver says stop."""
    while (step := broadcast_step(worker.tp, None)) is not None:
        worker.execute_model(*step)


def threads_per_rank(size: int) -> int:
    return max(1, (os.cpu_count() or 1) // size)


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """End this process (at once, no clean-up) when ``parent_pid`` is no longer its parent."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)
    threading.Thread(target=watch, name="paged-core-parent-watch", daemon=True).start()


def worker_main(spec: RankSpec, rank: int, size: int, init_method: str, parent_pid: int) -> None:
    """The life of a local worker process (rank ``rank`` of ``size``, started by ``parent_pid``;
    see ``launch``): it dies with its parent, ignores Ctrl-C and uses its share of the cores."""
    watch_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the driver, which stops us
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank {rank} %(levelname)s %(message)s")
    torch.set_num_threads(threads_per_rank(size))
    run_rank(spec, rank, size, init_method)


def run_rank(spec: RankSpec, rank: int, size: int, init_method: str) -> None:
    """Join the group, build this rank's worker, serve steps; on any error log it and exit."""
    try:
        spec = for_rank(spec, rank)
        tp = init_process_group(rank, size, spec.device, init_method)
        worker = Worker(spec, tp)
        shard = worker.runner.model.shard
        logger.info("tensor-parallel rank %d of %d ready on %s: %d query heads, %d KV heads, "
                    "%d KV blocks", rank, size, spec.device, shard.num_heads, shard.num_kv_heads,
                    worker.num_blocks)
        serve_steps(worker)
        dist.destroy_process_group()
    except BaseException:
        logger.error("tensor-parallel worker rank %d failed:\n%s", rank, traceback.format_exc())
        os._exit(1)  # skip clean-up that could wait on the other ranks; the driver sees the exit
