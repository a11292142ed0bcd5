"""The engine's configuration: ``EngineConfig`` (flat names) made of typed parts."""
from .cache_config import CacheConfig
from .engine_config import EngineConfig
from .lora_config import LoRAConfig
from .model_config import ModelConfig
from .parallel_config import ParallelConfig
from .scheduler_config import (SERVING_ITL_TARGET_MS, SchedulerConfig, batch_limits,
                               resolved_async_scheduling, resolved_schedule_ahead)
from .serving_config import ServingConfig
from .setting_values import parse_size

__all__ = ["CacheConfig", "EngineConfig", "LoRAConfig", "ModelConfig", "ParallelConfig",
           "SERVING_ITL_TARGET_MS", "SchedulerConfig", "ServingConfig", "parse_size",
           "resolved_async_scheduling", "resolved_schedule_ahead", "batch_limits"]
