"""``BeamSearchParams``: the parameters of one beam search request (vLLM's names).

``LLM.beam_search(prompts, BeamSearchParams(beam_width=4, max_tokens=64))``
keeps the ``beam_width`` best continuations at every step and returns
``beam_width`` finished sequences, best first. Every invalid value raises
``ParamValidationError`` naming the field, as ``SamplingParams`` does; values are
checked on their own at construction, against the model and prompt by
``verify_for_model``, and against the KV cache by ``verify_kv_capacity``.

``early_stopping`` is transformers' option (vLLM has none; its default matches
transformers' default, ``False``): ``True`` ends the search as soon as
``beam_width`` hypotheses are finished; ``False`` ends it when the best running
beam, scored at its current length, cannot beat the worst finished hypothesis;
``"never"`` scores it at ``max_tokens`` instead when ``length_penalty > 0``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..exceptions import ParamValidationError
from ..param_checks import check_bool, check_int, check_number

MAX_BEAM_WIDTH = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class BeamSearchParams:
    """``temperature`` 0 scores tokens by their log-probabilities; ``> 0`` divides the
    logits by it first. ``ignore_eos`` keeps EOS out of the candidates, so every beam
    runs to ``max_tokens`` (as transformers' ``min_new_tokens`` does)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        check_int("beam_width", self.beam_width, lo=1, hi=MAX_BEAM_WIDTH)
        check_int("max_tokens", self.max_tokens, lo=1)
        check_number("temperature", self.temperature, ">= 0", self.temperature >= 0)
        check_number("length_penalty", self.length_penalty, "(any finite number)", True)
        for name in ("ignore_eos", "include_stop_str_in_output"):
            check_bool(name, getattr(self, name))
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ParamValidationError(f"early_stopping must be true, false or 'never', "
                                       f"got {self.early_stopping!r}", "early_stopping")

    @property
    def n(self) -> int:
        """Sequences returned per prompt (``SamplingParams.n``'s meaning): ``beam_width``."""
        return self.beam_width

    def verify_for_model(self, vocab_size: int, max_model_len: int,
                         num_prompt_tokens: int) -> None:
        """``max_tokens`` must fit in the context after the prompt; raises ``ParamValidationError``.

        (Any ``beam_width`` suits any vocabulary: a step keeps at most as many
        candidates as there are tokens.)"""
        room = max_model_len - num_prompt_tokens
        if self.max_tokens > room:
            raise ParamValidationError(
                f"max_tokens is too large: {self.max_tokens}. This model's context is "
                f"max_model_len={max_model_len} tokens and the prompt has {num_prompt_tokens}, "
                f"so at most {room} tokens can be generated; lower max_tokens or shorten the prompt",
                "max_tokens")

    def verify_kv_capacity(self, num_prompt_tokens: int, num_blocks: int, block_size: int) -> None:
        """The group must fit in the cache even with no block shared (a preempted beam
        recomputes alone), so it can always finish; raises ``ParamValidationError`` otherwise."""
        per_beam = _cdiv(num_prompt_tokens + self.max_tokens, block_size)
        if self.beam_width * per_beam > num_blocks:
            raise ParamValidationError(
                f"beam_width * (prompt + max_tokens) is too large for the KV cache: "
                f"{self.beam_width} beams of up to {num_prompt_tokens + self.max_tokens} tokens "
                f"need {self.beam_width * per_beam} blocks of {block_size} tokens, the cache has "
                f"{num_blocks}; lower beam_width or max_tokens, or raise kv_cache_memory",
                "beam_width")
