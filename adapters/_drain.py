"""Graceful drain on SIGTERM / SIGINT for adapters whose server (uvicorn) owns the signals.

``drain_on_signals(engine, timeout)`` must run in the main thread *after* the
server installed its own handlers (inside its startup: an ASGI lifespan, a
service constructor). It puts a handler in front of them that first drains the
engine (``AsyncEngine.drain`` in a thread: readiness false, new requests 503,
open ones finish or are aborted with an error after ``timeout`` s) and only
then runs the server's own handler (uvicorn stops accepting connections, waits
for open ones, runs the lifespan shutdown).

Why the server's handler waits: a server whose listening socket is shared with
a parent process (LitServe's) cannot refuse connections by closing its copy:
new clients would queue in the kernel's backlog, unanswered, until the parent
exits. While draining, the server keeps accepting and the engine answers 503.
A signal whose previous handler is not a function (default, ignored) only drains.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def drain_on_signals(engine: Any, timeout: float) -> None:
    """Drain ``engine`` on SIGTERM/SIGINT, then hand the signal to the previous handler (only
    the main thread may set handlers: elsewhere this logs a warning and does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        logger.warning("not in the main thread: SIGTERM will not drain the engine")
        return
    for sig in SIGNALS:
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            logger.info("signal %d: draining the engine (drain_timeout=%g s)", signum, timeout)

            def drain_then_exit() -> None:
                engine.drain(timeout)
                if callable(previous):
                    previous(signum, frame)

            threading.Thread(target=drain_then_exit, name="paged-core-drain", daemon=True).start()

        signal.signal(sig, handler)
