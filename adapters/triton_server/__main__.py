"""``python -m paged_core.adapters.triton_server --host 127.0.0.1 --port 8000``.

Writes a model repository for ``EngineConfig.from_env()`` (``PAGED_CORE_*``
variables) to a temporary directory and runs the bundled ``tritonserver`` on it:
HTTP on ``--port``, gRPC on ``--grpc-port`` (default port+1), metrics on
``--metrics-port`` (default port+2). ``--write-repository DIR`` only writes the
repository and exits.
"""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m paged_core.adapters.triton_server",
                                     description="Serve paged-core through Triton Inference Server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port")
    parser.add_argument("--grpc-port", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--model-name", default="paged_llm")
    parser.add_argument("--write-repository", metavar="DIR", default=None,
                        help="write the model repository to DIR and exit")
    args = parser.parse_args(argv)

    from paged_core.config import EngineConfig

    config = EngineConfig.from_env()
    if args.write_repository:
        from .repository import write_repository

        print(write_repository(args.write_repository, config, args.model_name))
        return
    from .launcher import serve

    serve(args.host, args.port, config, args.grpc_port, args.metrics_port, args.model_name)


if __name__ == "__main__":
    main()
