"""``ModelConfig``: which model runs, and how (dtype, device, attention, determinism)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..quantization.checkpoint_format import QUANTIZATIONS, stored_quantization
from .setting_values import check_choice, check_positive, env_flag

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_ATTENTION_BACKENDS = ("auto", "torch", "triton")
_CUDAGRAPH_MODES = ("FULL_DECODE_ONLY", "FULL", "NONE")  # vLLM's names (executor.cuda_graphs)
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


@dataclass
class ModelConfig:
    """``model`` is a Hugging Face folder, a ``.gguf`` file, or ``None`` for the embedded
    SmolLM2-135M-Instruct; ``served_model_name`` is what clients call it (default: the
    folder's or file's name). ``max_model_len`` caps a sequence (default: the model's
    ``max_position_embeddings``). ``seed`` seeds the sampler of requests without their own.

    ``batch_invariant`` (vLLM's batch-invariant mode; default: the environment variable
    ``PAGED_CORE_BATCH_INVARIANT``, else off) makes a request's greedy tokens bit-identical
    whatever else shares its steps, at a speed cost (``models.batch_invariant``); CPU only,
    float32 or bfloat16.

    ``quantization`` (vLLM's name) serves stored quantized weights as they are, on the CPU:
    ``"compressed-tensors"``, ``"gptq"``, ``"awq"`` (a folder's ``quantization_config``) or
    ``"gguf"`` (a GGUF file's quantized projections; the embedded model's are Q4_1). Left
    ``None`` it is read from the checkpoint (``quantization.checkpoint_format``): a quantized
    folder or a ``.gguf`` file is served quantized, the embedded model dense; a value that
    contradicts the checkpoint is refused.

    ``enforce_eager`` (vLLM's name) runs every step eagerly; by default steps replay CUDA
    graphs on a single CUDA device (``executor.cuda_graphs``: a Llama-3.2-1B-shaped model
    decodes one sequence in 1.6 ms a step instead of 20 on an H200); MoE models, tensor
    parallelism, LoRA and the CPU always run eagerly. ``cudagraph_mode`` (vLLM's name and
    values) picks which steps replay graphs: ``"FULL"`` (the default) decode steps of at most
    ``max_cudagraph_capture_size`` sequences and every other step of at most that many tokens
    (prefill chunks beside decodes, speculative verification: 11-16% more output tokens a
    second than decode graphs alone on an H200's offline mix); ``"FULL_DECODE_ONLY"`` those
    decode steps; ``"NONE"`` none, as ``enforce_eager``.
    """

    model: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    attention_backend: str = "auto"
    seed: int = 0
    batch_invariant: bool = field(default_factory=lambda: env_flag("batch_invariant"))
    quantization: str | None = None
    enforce_eager: bool = False
    cudagraph_mode: str = "FULL"
    max_cudagraph_capture_size: int = 512

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, _DTYPES)
        check_choice("attention_backend", self.attention_backend, _ATTENTION_BACKENDS)
        if self.max_model_len is not None:
            check_positive("max_model_len", self.max_model_len)
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be true or false, got {self.enforce_eager!r}")
        check_choice("cudagraph_mode", self.cudagraph_mode, _CUDAGRAPH_MODES)
        check_positive("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be true or false, got {self.batch_invariant!r}")
        if self.model is not None and not os.path.exists(self.model):
            raise ValueError(
                f"model {self.model!r} does not exist: give a Hugging Face model folder, "
                f"a .gguf file, or leave it unset for the embedded SmolLM2-135M-Instruct")
        self._resolve_quantization()

    def _resolve_quantization(self) -> None:
        stored = stored_quantization(self.model)
        if self.quantization is None:  # read from the checkpoint; GGUF dense if batch-invariant
            self.quantization = None if stored == "gguf" and self.batch_invariant else stored
        if self.quantization is None:
            return
        check_choice("quantization", self.quantization, QUANTIZATIONS)
        if self.quantization != (stored or ("gguf" if self.model is None else None)):
            raise ValueError(f"quantization={self.quantization!r} does not match model "
                             f"{self.model!r}, stored as {stored or 'plain weights'}: leave "
                             f"quantization unset to read it from the checkpoint")
        if self.batch_invariant:
            raise ValueError(f"quantization={self.quantization!r} cannot run with "
                             f"batch_invariant: its kernels' sums depend on the batch; leave "
                             f"one of them unset")

    @property
    def model_name(self) -> str:
        """The name clients use for this model (OpenAI ``model`` field)."""
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return EMBEDDED_MODEL_NAME
        return os.path.basename(os.path.normpath(self.model))
