"""``AsyncEngine``: the engine for servers. A background thread runs the step loop; each
request gets an async stream of ``RequestOutput`` deltas.

Threading model: all engine state is touched only by the step-loop thread.
Callers (any event loop, any thread) validate and tokenize requests in a worker
thread (so a huge prompt never stalls their event loop), then hand ``AddRequest`` /
``AbortRequest`` commands (``engine_commands``) to the loop through a locked list; the loop applies them
between steps and posts each step's outputs back with one ``call_soon_threadsafe`` per
consumer event loop (``_deliver_all``). A stream
whose consumer goes away (cancellation, ``aclose``, a client disconnect) sends
an abort, so its blocks are freed within one step.

Admission: at most ``max_waiting_requests`` requests wait for their first
output at once (``AdmissionGate``); one more is refused at once with
``EngineOverloadedError``, before it is tokenized or queued.

Deadlines: a request's ``timeout`` (or ``EngineConfig.request_timeout``) counts
from its arrival in ``generate``; the step loop checks deadlines between steps,
aborts an expired request (``finish_reason`` "abort", blocks freed) and ends its
stream with ``RequestTimeoutError`` carrying that last output.

Drain (graceful shutdown): ``drain(timeout)`` refuses new requests at once
(``EngineDeadError``; ``is_running`` False, so readiness probes fail), lets the
open ones finish for up to ``timeout`` seconds, then stops the loop, which ends
every remaining stream with ``EngineDeadError`` saying so.

Failures: a request that fails inside the engine ends its own stream with
``RequestFailedError``; the loop goes on. If the loop itself fails, it logs the
traceback, then ends every open stream with ``EngineDeadError`` (``__cause__``
is the failure) *before* any clean-up that could raise, so no consumer is left
waiting; from then on ``is_running`` is False, ``errored`` True, and ``generate`` raises
``EngineDeadError``. A tensor-parallel worker that dies is such a failure, noticed
within a second even while the engine is idle. When the loop ends (shutdown or
failure) it reaps the engine's worker processes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from typing import Any, AsyncIterator

from .beam_search.params import BeamSearchParams
from .frontend.chat_prompt import chat_prompt_token_ids
from .serving.admission import AdmissionGate
from .config import SERVING_ITL_TARGET_MS, EngineConfig
from .core.engine_stats import EngineStats
from .cpu.openmp_team import release_openmp_team
from .requests.engine_io import EngineRequest
from .serving.deadlines import Deadlines, check_timeout
from .engine.llm_engine import LLMEngine
from .serving.engine_commands import AbortRequest, AddRequest, EngineCommand, RemoveLora
from .exceptions import EngineDeadError, ParamValidationError, RequestTimeoutError
from .lora.modules import parse_lora_modules
from .lora.request import LoRARequest
from .outputs import RequestOutput
from .frontend.prompts import PromptInput
from .sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# how often an idle loop checks the engine's workers and looks at the free cores
_HEALTH_CHECK_INTERVAL_S = 0.5


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, **engine_args: Any) -> None:
        self.config = config or EngineConfig(**engine_args)
        if self.config.itl_target_ms is None:  # a server's default: bound decode stalls
            self.config = dataclasses.replace(self.config, itl_target_ms=SERVING_ITL_TARGET_MS)
        self.engine = LLMEngine(self.config, usage="server")
        self.config = self.engine.config  # every setting resolved for the device
        self._lock = threading.Lock()
        self._commands: list[EngineCommand] = []
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._gate = AdmissionGate(self.config.max_waiting_requests)
        self._deadlines = Deadlines()
        self._dead: BaseException | None = None
        self._stopping = False
        self._draining: float | None = None  # drain_timeout once a drain began
        self._loras: dict[str, LoRARequest] = {}  # served adapters by name (OpenAI ``model``)
        for name, path in parse_lora_modules(self.config.lora_modules or ""):
            self._register_lora(LoRARequest(name, len(self._loras) + 1, path))
        # The loop's thread runs every step: this thread's OpenMP workers, left from loading,
        # would make libgomp stop spinning between the steps' ops (openmp_team).
        release_openmp_team()
        self._thread = threading.Thread(target=self._run_loop, name="paged-core-engine", daemon=True)
        self._thread.start()

    # -- information -----------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_running(self) -> bool:
        """True while requests are accepted: not shut down, not stopping, not dead."""
        return (not self._stopping and self._draining is None and self._dead is None
                and self._thread.is_alive())

    @property
    def errored(self) -> bool:
        """True once the step loop died of an error (vLLM's name); a clean shutdown is not one."""
        return self._dead is not None

    def stats(self) -> EngineStats:
        """The engine's stats plus admission control's ``num_rejected`` requests so far."""
        return dataclasses.replace(self.engine.stats(), num_rejected=self._gate.num_rejected)

    @property
    def tool_call_parser(self) -> str | None:
        return self.config.tool_call_parser

    def apply_chat_template(self, messages: list[dict], tools: list | None = None) -> list[int]:
        return chat_prompt_token_ids(self.engine.tokenizer, messages, tools)

    # -- LoRA adapters (vLLM's names) ------------------------------------------------
    @property
    def lora_requests(self) -> list[LoRARequest]:
        """The adapters served by name (``lora_modules`` and ``load_lora_adapter``), in id
        order."""
        return sorted(self._loras.values(), key=lambda r: r.lora_int_id)

    @property
    def allow_runtime_lora_updating(self) -> bool:
        return self.config.allow_runtime_lora_updating

    def _register_lora(self, request: LoRARequest) -> None:
        self.engine.add_lora(request)
        self._loras[request.lora_name] = request

    async def load_lora_adapter(self, lora_name: str, lora_path: str) -> LoRARequest:
        """Serve the PEFT adapter at ``lora_path`` as ``lora_name`` (read and checked off the
        event loop); ``ParamValidationError`` if the name is taken or the adapter is refused."""
        if lora_name in self._loras:
            raise ParamValidationError(f"The lora adapter '{lora_name}' has already been "
                                       f"loaded", "lora_name")
        next_id = max([r.lora_int_id for r in self._loras.values()] + [0]) + 1
        request = LoRARequest(lora_name, next_id, lora_path)
        await asyncio.to_thread(self._register_lora, request)
        return request

    async def unload_lora_adapter(self, lora_name: str) -> bool:
        """Stop serving ``lora_name``; False if no such adapter is served or a request still
        runs or waits under it (removal happens between steps, on the step loop)."""
        request = self._loras.get(lora_name)
        if request is None:
            return False
        self._check_alive()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._submit(RemoveLora(request.lora_int_id, done))
        removed = await asyncio.wrap_future(done)
        if removed:
            self._loras.pop(lora_name, None)
        return removed

    # -- requests --------------------------------------------------------------------
    async def generate(self, prompt: PromptInput,
                       sampling_params: SamplingParams | BeamSearchParams | None = None,
                       request_id: str | None = None, *, priority: int = 0,
                       timeout: float | None = None, tenant: str | None = None,
                       lora_request: LoRARequest | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request (a beam search request has one output, its last).

        ``priority`` is vLLM's (lower runs first under ``scheduling_policy="priority"``);
        ``timeout`` (seconds, default ``EngineConfig.request_timeout``) is the request's
        deadline; ``tenant`` (e.g. the OpenAI ``user``) groups requests for
        ``tenant_fairness``; ``lora_request`` runs it under that adapter (``enable_lora``).

        Raises ``ValueError`` before the first output for bad input,
        ``EngineOverloadedError`` (before anything is queued) when
        ``max_waiting_requests`` requests already wait, ``RequestFailedError``
        if the request fails inside the engine, and ``EngineDeadError`` if the
        engine is not running or stops.
        """
        self._check_alive()
        timeout = check_timeout(self.config.request_timeout if timeout is None else timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        request_id = request_id or uuid.uuid4().hex
        request = await self._admit(request_id, prompt, sampling_params, priority, tenant,
                                    deadline, lora_request)
        waiting = True  # holds an admission slot until its first output
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        finished = False
        try:
            self._check_alive()  # a loop that stops from now on ends this stream itself
            self._submit(AddRequest(request, timeout))
            while not finished:
                item = await queue.get()
                if waiting:
                    waiting = False
                    self._gate.release()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if waiting:
                self._gate.release()
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(AbortRequest(request_id))

    async def _admit(self, request_id: str, prompt: PromptInput,
                     params: SamplingParams | BeamSearchParams | None, priority: int,
                     tenant: str | None, deadline: float | None,
                     lora_request: LoRARequest | None = None) -> EngineRequest:
        """Take an admission slot (``EngineOverloadedError`` if none is left), then validate
        and tokenize off the event loop (``make_request``); the slot is given back if that
        raises, and otherwise held until the request's first output."""
        self._gate.admit()
        try:
            request = await asyncio.to_thread(self.engine.make_request, request_id, prompt,
                                              params, priority=priority, tenant=tenant,
                                              deadline=deadline, lora_request=lora_request)
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in use")
            return request
        except BaseException:
            self._gate.release()
            raise

    async def beam_search(self, prompt: PromptInput, request_id: str | None,
                          params: BeamSearchParams) -> AsyncIterator[RequestOutput]:
        """vLLM's ``EngineClient.beam_search``: yields one final ``RequestOutput`` whose
        ``outputs`` are the ``beam_width`` best sequences, best first."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        async for out in self.generate(prompt, params, request_id):
            yield out

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with ``finish_reason="abort"``, its blocks are freed."""
        self._submit(AbortRequest(request_id))

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown_sync)

    def drain(self, timeout: float) -> bool:
        """Graceful stop (thread-safe, blocking; see the module docstring). Returns True if
        every open request finished within ``timeout`` seconds, False if some were aborted."""
        if self._draining is None:
            self._draining = timeout
            logger.info("draining: no new requests; %d open ones get up to %g s to finish",
                        len(self._streams), timeout)
        deadline = time.monotonic() + timeout
        while self._streams and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        clean = not self._streams
        if not clean:
            logger.warning("drain timeout (%g s): aborting %d open requests", timeout,
                           len(self._streams))
        self.shutdown_sync()
        return clean

    def shutdown_sync(self) -> None:
        """Stop the step loop, end every open stream with ``EngineDeadError``, join the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    # -- the step loop (engine thread) -----------------------------------------------
    def _submit(self, command: EngineCommand) -> None:
        with self._lock:
            self._commands.append(command)
        self._wake.set()

    def _check_alive(self) -> None:
        if self._stopping or self._draining is not None or self._dead is not None:
            raise self._dead_error()

    def _dead_error(self) -> EngineDeadError:
        """A fresh ``EngineDeadError`` (one per stream), chained to the loop's failure if any."""
        if self._dead is None and self._draining is not None:
            return EngineDeadError(
                "the server is shutting down: it takes no new requests, and open ones are "
                f"aborted after drain_timeout={self._draining:g} s; retry on another replica")
        if self._dead is None:
            return EngineDeadError("the engine is shut down")
        error = EngineDeadError(
            f"the engine stopped after an internal error ({type(self._dead).__name__}: "
            f"{self._dead}); it serves no more requests until it is restarted")
        error.__cause__ = self._dead
        return error

    def _run_loop(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                self._expire_deadlines()
                self.engine.check_health()  # a dead tensor-parallel worker ends the loop, idle too
                if not self.engine.has_unfinished_requests():
                    self.engine.look_while_idle()
                    self._wake.wait(timeout=_HEALTH_CHECK_INTERVAL_S)
                    self._wake.clear()
                    continue
                unread = self._deliver_all([(out.request_id, out.error or out)
                                            for out in self.engine.step()])
                for request_id in unread:
                    self.engine.abort_request(request_id)
        except BaseException as exc:  # surfaced to every stream and to later callers
            self._dead = exc
            logger.error("the engine stopped: %s: %s; failing its %d open requests with "
                         "EngineDeadError", type(exc).__name__, exc, len(self._streams),
                         exc_info=exc)
        finally:
            self._stopping = True  # before the streams are listed: see generate()
            for request_id in list(self._streams):
                self._deliver(request_id, self._dead_error())
            self._free_all_requests()
            self._stop_workers()

    def _stop_workers(self) -> None:
        """Reap the engine's tensor-parallel worker processes (none without tensor parallelism)."""
        try:
            self.engine.shutdown()
        except Exception:
            logger.exception("could not shut the engine's workers down cleanly")

    def _free_all_requests(self) -> None:
        """Abort what the engine still holds; after a failure its state may be broken."""
        try:
            for request_id in self.engine.request_ids:
                self.engine.abort_request(request_id)
        except Exception:
            logger.exception("could not free the requests of the stopped engine")

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for command in commands:
            if isinstance(command, AddRequest):
                self._add(command)
            elif isinstance(command, RemoveLora):
                command.done.set_result(self.engine.remove_lora(command.lora_id))
            else:
                self._abort(command.request_id)

    def _add(self, command: AddRequest) -> None:
        request = command.request
        if request.request_id not in self._streams:
            return  # its consumer left before the request reached the engine
        try:
            self.engine.add_request(request)
        except ValueError as exc:  # e.g. a request id still in use
            self._deliver(request.request_id, exc)
            return
        if request.deadline is not None:
            self._deadlines.add(request, request.deadline, command.timeout)

    def _abort(self, request_id: str) -> None:
        out = self.engine.abort_request(request_id)
        if out is not None:
            self._deliver(request_id, out.error or out)

    def _expire_deadlines(self) -> None:
        """Abort every request past its deadline; its stream ends with ``RequestTimeoutError``."""
        for request, timeout in self._deadlines.expired():
            request_id = request.request_id
            if not self.engine.holds(request):
                continue  # it finished in time
            out = self.engine.abort_request(request_id)
            error = out.error or RequestTimeoutError(
                request_id, f"request {request_id} did not finish within its timeout of "
                            f"{timeout:g} s and was aborted; raise timeout or ask for fewer "
                            f"tokens", output=out)
            self._deliver(request_id, error)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> bool:
        """Post ``item`` to the request's stream; False if nobody will ever read it."""
        return not self._deliver_all([(request_id, item)])

    def _deliver_all(self, items: list[tuple[str, RequestOutput | BaseException]]) -> list[str]:
        """Post each ``(request_id, item)`` to its request's stream, with one
        ``call_soon_threadsafe`` per consumer event loop (a step's outputs for a hundred
        streams of one server wake its loop once, not a hundred times, and the step loop
        takes the GIL from it once); returns the request ids nobody will ever read: no
        stream, or a consumer whose event loop is closed (that stream is dropped).

        Never raises. Each stream gets its items in ``items``' order."""
        unread: list[str] = []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[str, asyncio.Queue, Any]]] = {}
        for request_id, item in items:
            stream = self._streams.get(request_id)
            if stream is None:
                unread.append(request_id)
                continue
            loop, queue = stream
            by_loop.setdefault(loop, []).append((request_id, queue, item))
        for loop, posts in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_each, posts)
            except RuntimeError:  # the consumer's event loop is closed: nobody will read them
                for request_id, _, _ in posts:
                    self._streams.pop(request_id, None)
                    unread.append(request_id)
        return unread


def _put_each(posts: list[tuple[str, asyncio.Queue, Any]]) -> None:
    """On the consumer's event loop: each item into its stream's queue."""
    for _, queue, item in posts:
        queue.put_nowait(item)
