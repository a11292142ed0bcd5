"""``AsyncEngine``: the engine for servers. A background thread runs the step loop; each
request gets an async stream of ``RequestOutput`` deltas.

Threading model: all engine state is touched only by the step-loop thread.
Callers (any event loop, any thread) validate and tokenize requests themselves,
then hand ``add`` / ``abort`` commands to the loop through a locked list; the
loop applies them between steps and posts outputs back with
``call_soon_threadsafe``. A stream whose consumer goes away (cancellation,
``aclose``, a client disconnect) sends an abort, so its blocks are freed
within one step.
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, AsyncIterator

from .chat import chat_prompt_token_ids
from .config import EngineConfig
from .engine import LLMEngine
from .outputs import RequestOutput
from .prompts import PromptInput
from .sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The step loop stopped (shutdown or an internal error); no request can be served."""


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, **engine_args: Any) -> None:
        self.config = config or EngineConfig(**engine_args)
        self.engine = LLMEngine(self.config)
        self._lock = threading.Lock()
        self._commands: list[tuple[str, Any]] = []
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._dead: BaseException | None = None
        self._stopping = False
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
        return self._dead is None and self._thread.is_alive()

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        return chat_prompt_token_ids(self.engine.tokenizer, messages)

    # -- requests --------------------------------------------------------------------
    async def generate(self, prompt: PromptInput, sampling_params: SamplingParams | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream outputs of one request; raises ``ValueError`` before the first for bad input."""
        self._check_alive()
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        request = self.engine.make_request(request_id, prompt, sampling_params)
        queue: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), queue)
        self._submit("add", request)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit("abort", request_id)

    async def abort(self, request_id: str) -> None:
        """Abort a request; its stream ends with ``finish_reason="abort"``, its blocks are freed."""
        self._submit("abort", request_id)

    async def shutdown(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.shutdown_sync)

    def shutdown_sync(self) -> None:
        """Stop the step loop, end every open stream with ``EngineDeadError``, join the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    # -- the step loop (engine thread) -----------------------------------------------
    def _submit(self, kind: str, payload: Any) -> None:
        with self._lock:
            self._commands.append((kind, payload))
        self._wake.set()

    def _check_alive(self) -> None:
        if self._stopping or self._dead is not None:
            raise EngineDeadError(f"the engine is not running ({self._dead or 'shut down'})")

    def _run_loop(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as exc:  # surfaced to every stream and to later callers
            self._dead = exc
        finally:
            self._stopping = True
            error = EngineDeadError(f"the engine stopped: {self._dead or 'shut down'}")
            for request_id in list(self.engine.requests):
                self.engine.abort_request(request_id)
            for request_id in list(self._streams):
                self._deliver(request_id, error)

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for kind, payload in commands:
            if kind == "add":
                if payload.request_id not in self._streams:
                    continue  # its consumer left before the request reached the engine
                try:
                    self.engine.add_request(payload)
                except ValueError as exc:  # e.g. a request id still in use
                    self._deliver(payload.request_id, exc)
            else:
                out = self.engine.abort_request(payload)
                if out is not None:
                    self._deliver(payload, out)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is None:
            return
        loop, queue = stream
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody will read it
            self._streams.pop(request_id, None)
            self.engine.abort_request(request_id)
