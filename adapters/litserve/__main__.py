"""``python -m paged_core.adapters.litserve --host 127.0.0.1 --port 8000``.

Engine settings come from ``PAGED_CORE_*`` variables. LitServe spawns its
worker by re-importing this module as ``__mp_main__``: the guard below keeps
that import from starting a second server.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paged_core.adapters.litserve",
                                     description="Serve paged-core through LitServe")
    parser.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "0.0.0.0", "::"))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)

    from paged_core.config import EngineConfig

    from .server import run

    run(host=args.host, port=args.port, config=EngineConfig.from_env(), log_level=args.log_level)


if __name__ == "__main__":
    main()
