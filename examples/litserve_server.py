"""Serve the engine through LitServe from Python, with explicit engine settings.

    python examples/litserve_server.py --port 8000
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
        -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}'

Equivalent to ``python -m paged_core.adapters.litserve --port 8000`` with
PAGED_CORE_* variables. The ``__main__`` guard is required: LitServe starts its
worker by re-importing this file.
"""
from __future__ import annotations

import argparse

from paged_core import EngineConfig
from paged_core.adapters.litserve.server import run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: embedded)")
    args = parser.parse_args()
    config = EngineConfig(model=args.model, dtype="float32", max_num_seqs=32,
                          kv_cache_memory="512MiB")
    run(host="127.0.0.1", port=args.port, config=config)  # Ctrl-C stops it cleanly


if __name__ == "__main__":
    main()
