"""Graceful drain on SIGTERM / SIGINT for adapters whose server (uvicorn) owns the signals.

``drain_on_signals(engine, timeout)`` must run in the main thread *after* the
server installed its own handlers (inside its startup: an ASGI lifespan, a
service constructor). It chains a handler in front of them: the engine starts
draining at once (``AsyncEngine.drain`` in a thread: readiness false, new
requests 503, open ones finish or are aborted with an error after
``timeout`` s), then the server's own handler runs as before (uvicorn stops
accepting connections, waits for open ones, runs the lifespan shutdown). A
signal whose previous handler is not a function (default, ignored) only drains.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def drain_on_signals(engine: Any, timeout: float) -> None:
    """Chain a drain of ``engine`` in front of the current SIGTERM/SIGINT handlers (only the
    main thread may set handlers: elsewhere this logs a warning and does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        logger.warning("not in the main thread: SIGTERM will not drain the engine")
        return
    for sig in SIGNALS:
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            logger.info("signal %d: draining the engine (drain_timeout=%g s)", signum, timeout)
            threading.Thread(target=engine.drain, args=(timeout,), name="paged-core-drain",
                             daemon=True).start()
            if callable(previous):
                previous(signum, frame)

        signal.signal(sig, handler)
