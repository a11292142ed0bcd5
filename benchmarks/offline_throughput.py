"""Offline throughput bar of the engine core: paged-core vs naive ``transformers`` static batching.

``python benchmarks/offline_throughput.py [--quick] [--dtype bfloat16] [--out DIR]``

100 seeded requests with varied prompt and output lengths, one timed run of
each system (same model, dtype and threads); prints the ratio and writes
``benchmarks/results/offline_throughput.json`` + ``.png``. A thin entry over
``paged-core bench throughput`` (see ``paged_core/bench/throughput.py``).
"""
import sys
from pathlib import Path

from paged_core.bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["throughput", "--systems", "paged-core,hf-static", "--repeats", "1",
                   "--name", "offline_throughput", "--out", str(Path(__file__).parent),
                   *sys.argv[1:]]))
