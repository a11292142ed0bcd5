"""``CacheConfig``: the paged KV cache's block size, its size, its dtype, and prefix caching."""
from __future__ import annotations

from dataclasses import dataclass

from ..attention.kv_quant import KV_CACHE_DTYPES
from .setting_values import check_choice, check_positive, parse_size

BLOCK_SIZES = (8, 16, 32, 64, 128)


@dataclass
class CacheConfig:
    """The KV cache is sized by ``num_kv_blocks`` if given, else ``kv_cache_memory`` bytes
    (an int or text like ``"2GiB"``, kept as an int), else (CUDA) a fraction
    ``gpu_memory_utilization`` of free device memory, else 1 GiB on CPU (per rank under
    tensor parallelism). ``enable_prefix_caching`` shares the blocks of equal prompt
    prefixes between requests. ``kv_cache_dtype`` (vLLM's name) stores K and V as the model
    dtype (``"auto"``) or quantized with a float32 scale per token and KV head: ``"int8"``,
    ``"fp8_e4m3"`` (also ``"fp8"``) or ``"fp8_e5m2"`` (``paged_core.attention.kv_quant``);
    a smaller cache row means more blocks in the same ``kv_cache_memory``.

    ``block_size`` (tokens a block holds, 8-128) defaults to 16 on every device; vLLM-CPU
    takes 128. Prefix hits come in whole blocks, so larger blocks share less of short
    prompts. Larger blocks are longer runs of K and V for decode attention to read (``bench
    attention --block-size``), but the engine hands each prompt its blocks together, mostly
    side by side, so 16-token blocks decoded long prompts as fast as 128-token ones (README,
    "Block size and where blocks lie")."""

    block_size: int = 16
    kv_cache_memory: int | str | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.85
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        if self.num_kv_blocks is not None:
            check_positive("num_kv_blocks", self.num_kv_blocks)
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_size(self.kv_cache_memory)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
