"""``LLM``: the offline batch API (vLLM-style ``generate`` and ``chat``)."""
from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable, Sequence

from .beam_search.results import BeamSearchOutput, beam_search_output
from .beam_search.params import BeamSearchParams
from .frontend.chat_prompt import chat_prompt_token_ids
from .config import EngineConfig
from .core.engine_stats import EngineStats
from .engine.llm_engine import LLMEngine
from .outputs import RequestOutput
from .frontend.prompts import PromptInput, is_single_prompt
from .lora.request import LoRARequest
from .sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """Load a model once; generate for many prompts with continuous batching.

    ``LLM()`` loads the embedded SmolLM2-135M-Instruct; keyword arguments are
    ``EngineConfig`` fields (``dtype``, ``block_size``, ``kv_cache_memory``,
    ``num_kv_blocks``, ``max_num_seqs``, ``max_num_batched_tokens``, ...).
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))
        self._ids = itertools.count()

    def shutdown(self) -> None:
        """Stop tensor-parallel worker processes now (otherwise when this ``LLM`` is collected)."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        """The engine's ``EngineStats`` (typed; also readable as a flat mapping of numbers)."""
        return self.engine.stats()

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register a PEFT adapter (checked against the model now); True if it is new."""
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        """Forget adapter ``lora_id``; False if unknown or a request still uses it."""
        return self.engine.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        """The ids of the registered adapters."""
        return self.engine.list_loras()

    def reset_prefix_cache(self) -> None:
        """Forget every prefix-cached block that no request holds (as vLLM's ``LLM`` does).

        Later prompts then recompute their prefixes: e.g. before each repeat of
        a benchmark, so a repeat does not hit on the blocks of the previous one.
        """
        self.engine.reset_prefix_cache()

    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None
                 ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order. Under
        ``enable_lora``, ``lora_request`` runs every prompt (or, a list, each prompt) under
        that PEFT adapter (``None``: the base model).

        A request that failed inside the engine comes back with ``error`` set
        (a ``RequestFailedError``) and no ``outputs``; the others are unaffected.
        """
        prompt_list = [prompts] if is_single_prompt(prompts) else list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} sampling_params for "
                                 f"{len(prompt_list)} prompts; give one, or one per prompt")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * len(prompt_list)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompt_list):
                raise ValueError(f"got {len(loras)} lora_request for {len(prompt_list)} "
                                 f"prompts; give one, or one per prompt")
        return self._generate(prompt_list, params_list, use_tqdm, loras)

    def beam_search(self, prompts: PromptInput | Sequence[PromptInput], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search for every prompt (vLLM's ``LLM.beam_search``), inside the engine.

        Each result holds ``params.beam_width`` sequences, best first; their
        ``tokens`` are prompt + generated, ``text`` the generated text.
        """
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        prompt_list = [prompts] if is_single_prompt(prompts) else list(prompts)
        outputs = self._generate(prompt_list, [params] * len(prompt_list), use_tqdm)
        return [beam_search_output(out) for out in outputs]

    def _generate(self, prompt_list: list[PromptInput],
                  params_list: list[SamplingParams | BeamSearchParams],
                  use_tqdm: bool, loras: list[LoRARequest | None] | None = None
                  ) -> list[RequestOutput]:
        engine = self.engine
        loras = loras or [None] * len(prompt_list)
        final_only = _final_only(params_list)
        requests = [engine.make_request(f"llm-{next(self._ids)}", p, final_only(sp),
                                        lora_request=lora)
                    for p, sp, lora in zip(prompt_list, params_list, loras)]
        for request in requests:
            engine.add_request(request)
        finished: dict[str, RequestOutput] = {}
        try:
            self._run(len(requests), finished, use_tqdm)
        except BaseException:
            for request in requests:
                engine.abort_request(request.request_id)
            raise
        return [finished[r.request_id] for r in requests]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """One conversation (a list of messages) or several (a list of such lists)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [{"prompt_token_ids": chat_prompt_token_ids(self.engine.tokenizer, c)}
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, total: int, finished: dict[str, RequestOutput], use_tqdm: bool) -> None:
        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=total, desc="Generating", unit="req", dynamic_ncols=True)
        start, tokens_at_start = time.perf_counter(), self.engine.generated_tokens
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    finished[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                elapsed = max(time.perf_counter() - start, 1e-9)
                rate = (self.engine.generated_tokens - tokens_at_start) / elapsed
                bar.set_postfix_str(f"{rate:.1f} tok/s", refresh=False)
        if bar is not None:
            bar.close()


def _final_only(params_list: list) -> Callable[[Any], Any]:
    """Maps each ``SamplingParams`` of ``params_list`` to a copy asking for
    ``RequestOutputKind.FINAL_ONLY`` (one copy per distinct object; the caller's objects stay
    as they are): ``LLM`` returns only final outputs, so the engine need not build the others."""
    copies = {id(sp): dataclasses.replace(sp, output_kind=RequestOutputKind.FINAL_ONLY)
              for sp in params_list if isinstance(sp, SamplingParams)
              and sp.output_kind != RequestOutputKind.FINAL_ONLY}
    return lambda sp: copies.get(id(sp), sp)
