"""Which slice of every weight a tensor-parallel rank holds (Megatron-style).

- column-parallel (output dimension split): ``q_proj`` by query heads,
  ``k_proj``/``v_proj`` by KV heads, ``gate_proj``/``up_proj`` by intermediate
  channels, ``embed_tokens``/``lm_head`` by vocabulary rows (padded to a multiple
  of the group size);
- row-parallel (input dimension split): ``o_proj`` and ``down_proj``; their
  outputs are partial sums, all-reduced once per layer;
- mixture-of-experts blocks (``moe.py``): every expert's ``width`` channels are split
  like a dense MLP's (gate/up rows, down columns), as is the shared expert's width;
  the router and the shared expert's gate are replicated;
- everything else (norms, q/k norms, the row-parallel biases) is replicated.

KV heads: with ``num_kv_heads >= size`` each rank holds ``num_kv_heads / size``
of them; with fewer KV heads than ranks each KV head is replicated on
``size / num_kv_heads`` consecutive ranks (as vLLM does), so every rank's query
heads find their KV head locally. Sizes that split neither way are refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from .spec import DecoderSpec

# (HF weight name fragment, dimension split, what it is split by); "mlp" is resolved to the
# width of the MLP the weight belongs to (``_mlp_split``)
_COLUMN_SPLITS = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "mlp",
                  "up_proj": "mlp", "w1": "mlp", "w3": "mlp", "embed_tokens": "vocab",
                  "lm_head": "vocab"}
_ROW_SPLITS = {"o_proj": "q", "down_proj": "mlp", "w2": "mlp"}


def allowed_tensor_parallel_sizes(spec: DecoderSpec, limit: int = 64) -> list[int]:
    return [s for s in range(1, limit + 1) if _split_problem(spec, s) is None]


def _split_problem(spec: DecoderSpec, size: int) -> str | None:
    if spec.num_heads % size:
        return f"{spec.num_heads} attention heads"
    if spec.num_kv_heads % size and size % spec.num_kv_heads:
        return f"{spec.num_kv_heads} KV heads (neither divides the other)"
    widths = [("an MLP width", spec.intermediate_size)]
    if spec.moe is not None:
        widths += [("an expert width", spec.moe.intermediate_size),
                   ("a shared-expert width", spec.moe.shared_expert_size)]
    for what, width in widths:
        if width % size:
            return f"{what} of {width}"
    if spec.qk_norm_over_heads and size > 1:
        return "q/k norms over all heads at once (OLMoE: tensor parallelism 1 only)"
    return None


def _mlp_split(parts: list[str]) -> str:
    """Which width an MLP weight's ``"mlp"`` split cuts: an expert's, the shared expert's or
    the dense MLP's."""
    if "experts" in parts:
        return "moe"
    return "shared" if "shared_expert" in parts else "mlp"


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of ``size``: its heads, MLP channels and vocabulary rows."""

    spec: DecoderSpec
    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        problem = _split_problem(self.spec, self.size)
        if problem:
            raise ValueError(
                f"tensor_parallel_size={self.size} does not divide this model's {problem}; "
                f"allowed sizes: {allowed_tensor_parallel_sizes(self.spec)}")

    @property
    def num_heads(self) -> int:
        return self.spec.num_heads // self.size

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.spec.num_kv_heads // self.size)

    @property
    def kv_head_start(self) -> int:
        if self.spec.num_kv_heads >= self.size:
            return self.rank * self.num_kv_heads
        return self.rank // (self.size // self.spec.num_kv_heads)  # replicated KV head

    @property
    def intermediate_size(self) -> int:
        return self.spec.intermediate_size // self.size

    @property
    def expert_channels(self) -> slice:
        """This rank's channels of each expert's width (MoE models)."""
        width = self.spec.moe.intermediate_size // self.size
        return slice(self.rank * width, (self.rank + 1) * width)

    @property
    def shared_expert_size(self) -> int:
        return self.spec.moe.shared_expert_size // self.size if self.spec.moe else 0

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding / LM head per rank (the last rank's tail is zero padding)."""
        return -(-self.spec.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_size

    def _range(self, split: str) -> tuple[int, int]:
        """Start and length of this rank's slice along a split dimension, in rows."""
        hd = self.spec.head_dim
        if split == "q":
            return self.rank * self.num_heads * hd, self.num_heads * hd
        if split == "kv":
            return self.kv_head_start * hd, self.num_kv_heads * hd
        if split == "mlp":
            return self.rank * self.intermediate_size, self.intermediate_size
        if split == "moe":
            channels = self.expert_channels
            return channels.start, channels.stop - channels.start
        if split == "shared":
            return self.rank * self.shared_expert_size, self.shared_expert_size
        return self.vocab_start, self.vocab_size

    def slice_of(self, name: str, shape: tuple[int, ...]) -> tuple[slice, ...] | None:
        """Index of this rank's part of checkpoint weight ``name`` (``None``: the whole weight).

        Vocabulary slices may run past the end (the caller zero-pads to ``vocab_size`` rows).
        Experts stacked in one tensor (``experts.gate_up_proj`` ``[E, 2 * width, hidden]``)
        are read whole: ``moe.SparseMoeBlock.load_expert_weight`` cuts both halves.
        """
        if self.size == 1:
            return None
        parts = name.split(".")
        kind = parts[-1]  # weight, bias, or a stacked experts tensor's own name
        if parts[-2:] == ["experts", "down_proj"]:  # [E, hidden, width]
            start, length = self._range("moe")
            return (slice(None), slice(None), slice(start, start + length))
        for fragment, split in _COLUMN_SPLITS.items():
            if fragment in parts:
                start, length = self._range(_mlp_split(parts) if split == "mlp" else split)
                return (slice(start, min(start + length, shape[0])),)
        for fragment, split in _ROW_SPLITS.items():
            if fragment in parts and kind == "weight":
                start, length = self._range(_mlp_split(parts) if split == "mlp" else split)
                return (slice(None), slice(start, start + length))
        return None
