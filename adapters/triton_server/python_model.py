"""The Triton Python-backend model (``TritonPythonModel``), decoupled for token streaming.

Imported by the repository's ``1/model.py`` inside Triton's Python stub (the
only place ``triton_python_backend_utils`` exists).

Invariants:
- one ``AsyncEngine`` per model instance, built from ``config.pbtxt``
  ``parameters`` (``EngineConfig.from_strings``); its requests run as tasks on
  one private event-loop thread, so every request of the instance is batched
  continuously together; ``execute`` only parses and schedules, never blocks;
- every request gets exactly one response flagged FINAL: its last delta
  (``stream=true``), its whole text (``stream=false``), or an error;
- a request refused because the waiting queue is full (``max_waiting_requests``),
  or because the engine is draining or dead, gets an UNAVAILABLE error response
  at once, never a hang;
- a request the client cancels (``is_cancelled()``, polled every
  ``CANCEL_POLL_S``) is aborted in the engine, freeing its KV blocks;
- unloading (Triton's shutdown on SIGINT/SIGTERM, or an explicit unload) drains
  the engine: open requests get ``drain_timeout`` seconds to finish, the rest
  end with an error response, and ``finalize`` returns only once every
  request's FINAL response is sent;
- a dead engine (its step loop failed: ``engine.errored``) unloads its model:
  within ``WATCH_PERIOD_S`` the watcher asks Triton, from a thread of its own,
  to unload this model (``pb_utils.unload_model``; ``finalize`` then answers the
  open requests first, as above). ``/v2/models/<name>/ready`` then stays non-200
  and requests are refused by Triton itself, until
  ``POST /v2/repository/models/<name>/load`` builds a fresh engine in a fresh
  stub. ``/v2/health/ready`` is non-200 only while the model unloads: Triton's
  strict readiness exempts unloaded models by design, so probe the model's
  endpoint. A model may unload itself only under
  ``--model-control-mode=explicit`` (the launcher's mode); in any other mode
  the model logs an error naming that flag, stays loaded, and answers every
  request UNAVAILABLE;
- custom metrics (``pb_utils.MetricFamily``) mirror ``engine.stats()``: the rows of the
  engine metrics table that the OpenAI layer exports too (``metrics.py``);
- the stub never outlives ``tritonserver``: if the server dies without unloading the
  model (killed, crashed, or past its ``--exit-timeout-secs``), the stub's own clean-up
  can hang holding the GIL, so a watcher process ends it (``stub_watch``).
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from paged_core import (AsyncEngine, EngineConfig, EngineDeadError, EngineOverloadedError,
                        LoRARequest, RequestOutput, SamplingParams)

from .metrics import TritonMetrics
from .request_parsing import parse_request
from .stub_watch import end_stub_with_server

CANCEL_POLL_S = 0.05
WATCH_PERIOD_S = 0.25  # metrics refresh; how soon a dead engine unloads its model
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _text_response(texts: list[str]) -> Any:
    tensor = pb_utils.Tensor("text_output", np.array(texts, dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[tensor])


def _log_failure(future: Any) -> None:
    """Done-callback: a request task or the watch task must never fail silently."""
    if not future.cancelled() and future.exception() is not None:
        pb_utils.Logger.log_error(f"paged_llm: background task failed: {future.exception()!r}")


async def _settle() -> None:
    """Wait for every other task of the running loop (the requests' ``_serve``) to end."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    await asyncio.gather(*others, return_exceptions=True)


def _explicit_model_control() -> bool:
    """True if the ``tritonserver`` running this stub (its parent process) has
    ``--model-control-mode=explicit``, the one mode where a model may unload itself.

    Checked first because, in this Triton build, ``pb_utils.unload_model`` in any
    other mode does not raise: the stub segfaults and the server aborts.
    """
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return False
    return ("--model-control-mode=explicit" in args
            or any(a == "--model-control-mode" and b == "explicit" for a, b in zip(args, args[1:])))


def _error_response(message: str, code: Any = None) -> Any:
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                "paged_llm needs `model_transaction_policy { decoupled: true }` in config.pbtxt")
        self._stub_watch = end_stub_with_server()
        settings = {k: v["string_value"] for k, v in model_config.get("parameters", {}).items()}
        self.config = EngineConfig.from_strings(settings)
        self.engine = AsyncEngine(self.config)
        self.model_name = args["model_name"]
        self.metrics = TritonMetrics(pb_utils.MetricFamily, self.model_name,
                                     self.engine.stats())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="paged-core-triton",
                                       daemon=True)
        self.thread.start()
        self._watch_task = asyncio.run_coroutine_threadsafe(self._watch_engine(), self.loop)
        self._watch_task.add_done_callback(_log_failure)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt, stream, params, lora_name = parse_request(
                    *(self._input(request, name)
                      for name in ("text_input", "stream", "sampling_parameters")))
                lora = self._lora(lora_name)
            except ValueError as exc:
                sender.send(_error_response(str(exc)), flags=FINAL)
                continue
            future = asyncio.run_coroutine_threadsafe(
                self._serve(sender, prompt, stream, params, lora), self.loop)
            future.add_done_callback(_log_failure)
        return None

    def finalize(self) -> None:
        self._watch_task.cancel()
        self.engine.drain(self.config.drain_timeout)
        try:
            asyncio.run_coroutine_threadsafe(_settle(), self.loop).result(timeout=10)
        except TimeoutError:
            pb_utils.Logger.log_error(f"{self.model_name}: requests still unanswered at unload")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        # drop the metric families while the stub runs: collected at its interpreter exit
        # instead, they crash it (Metric::Clear writes to the closed shared memory pool)
        del self.metrics

    @staticmethod
    def _input(request: Any, name: str) -> np.ndarray | None:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    def _lora(self, lora_name: str | None) -> LoRARequest | None:
        """The served adapter named ``lora_name`` (``None``: the base model); ``ValueError``
        naming the served ones otherwise."""
        if lora_name is None:
            return None
        served = {r.lora_name: r for r in self.engine.lora_requests}
        if lora_name not in served:
            raise ValueError(f"lora_name {lora_name!r} is not served here; served adapters: "
                             f"{sorted(served)} (PAGED_CORE_LORA_MODULES)")
        return served[lora_name]

    async def _serve(self, sender: Any, prompt: str, stream: bool, params: SamplingParams,
                     lora: LoRARequest | None = None) -> None:
        """Run one request to its FINAL response, racing it against client cancellation."""
        work = asyncio.ensure_future(self._generate(sender, prompt, stream, params, lora))
        while not work.done():
            await asyncio.wait([work], timeout=CANCEL_POLL_S)
            if not work.done() and sender.is_cancelled():
                work.cancel()  # closes the engine stream, which aborts the request
                await asyncio.gather(work, return_exceptions=True)
                sender.send(_error_response("request cancelled by the client",
                                            pb_utils.TritonError.CANCELLED), flags=FINAL)
                return
        error = work.exception()
        if isinstance(error, (EngineOverloadedError, EngineDeadError)):
            sender.send(_error_response(str(error), pb_utils.TritonError.UNAVAILABLE), flags=FINAL)
        elif error is not None:
            message = str(error) if isinstance(error, ValueError) else f"generation failed: {error!r}"
            sender.send(_error_response(message), flags=FINAL)

    async def _generate(self, sender: Any, prompt: str, stream: bool,
                        params: SamplingParams, lora: LoRARequest | None = None) -> None:
        request_id = f"triton-{uuid.uuid4().hex}"
        last: RequestOutput | None = None
        async for out in self.engine.generate(prompt, params, request_id=request_id,
                                              lora_request=lora):
            last = out
            if stream and (out.finished or any(c.delta_text for c in out.outputs)):
                sender.send(_text_response([c.delta_text for c in out.outputs]),
                            flags=FINAL if out.finished else 0)
        if last is None or not last.finished:
            raise RuntimeError("the engine stream ended before the request finished")
        if not stream:
            sender.send(_text_response([c.text for c in last.outputs]), flags=FINAL)

    async def _watch_engine(self) -> None:
        """Refresh the metrics every ``WATCH_PERIOD_S`` until the engine dies; then unload."""
        while not self.engine.errored:
            self.metrics.update(self.engine.stats())
            await asyncio.sleep(WATCH_PERIOD_S)
        if not _explicit_model_control():
            pb_utils.Logger.log_error(
                f"{self.model_name}: the engine is dead; the model stays loaded and answers every "
                "request UNAVAILABLE. Run tritonserver with --model-control-mode=explicit for the "
                "model to unload itself, so that its readiness follows the engine.")
            return
        pb_utils.Logger.log_warn(
            f"{self.model_name}: the engine is dead; unloading the model. Reload it with "
            f"POST /v2/repository/models/{self.model_name}/load")
        # not on this loop: Triton's unload calls finalize, which waits for this loop's tasks
        threading.Thread(target=pb_utils.unload_model, args=(self.model_name,),
                         name="paged-core-triton-unload", daemon=True).start()
