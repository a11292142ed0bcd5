"""``paged-core bench <benchmark> [--quick] [--out DIR] ...``: run benchmarks, write JSON + PNG.

``paged-core bench all`` runs every benchmark (options that only some of them
know, such as ``--vllm-python`` or ``--url``, go to those).

Invariant: a run writes only inside ``--out DIR`` (``benchmarks`` by default):
``DIR/results/<name>.json`` and ``.png``, and (``soak`` aside) ``DIR/README.md``,
regenerated from every result in ``DIR/results``.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from . import (attention, lora, memory, moe, prefix, quality, routing, serve, sharing, soak,
               spec, steps, structured, throughput, tp)
from .readme import write_readme
from .report import DEFAULT_OUT, results_dir, setup_threads, write_result

BENCHMARKS = {m.NAME: m for m in (throughput, steps, serve, memory, prefix, sharing, tp,
                                        structured, spec, attention, moe, quality, lora,
                                        routing)}
STANDALONE = {soak.NAME: soak}  # not part of ``bench all`` (a long server run, no README row)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke test)")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help="folder of the run: results/ (JSON + PNG) and README.md")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for every system (default: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged-core bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module in {**BENCHMARKS, **STANDALONE}.items():
        p = sub.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_common(p)
        module.add_arguments(p)
    every = sub.add_parser("all", help="every benchmark, then regenerate the README")
    _add_common(every)
    every.add_argument("--vllm-python", default=None, help="passed to throughput and serve")
    every.add_argument("--repeats", type=int, default=1, help="passed to throughput and serve")
    every.add_argument("--url", default=None, help="passed to serve")
    every.add_argument("--adapter", choices=("litserve", "bentoml"),
                       help="passed to serve")
    every.add_argument("--in-process", action="store_true", help="passed to serve")
    return parser


def _run_one(module, args: argparse.Namespace, argv: list[str]) -> None:
    args.argv = argv  # the command line, for results that print it (plot titles)
    results = module.run(args)
    name = getattr(args, "name", module.NAME)
    out = results_dir(args.out)
    write_result(out, name, argv, args.threads, results)
    module.plot(results, out, name)
    module.print_summary(results)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("note: set OMP_WAIT_POLICY=PASSIVE before starting (as `make bench` does): "
              "spinning OpenMP threads distort timings on shared machines", file=sys.stderr)
    threads = setup_threads(args.threads)
    if args.benchmark != "all":
        args.threads = threads
        _run_one({**BENCHMARKS, **STANDALONE}[args.benchmark], args, argv)
        if args.benchmark in BENCHMARKS:  # its README section now shows the new result
            print(f"wrote {write_readme(args.out, list(BENCHMARKS.values()))}", file=sys.stderr)
        return 0
    failed = []
    for name, module in BENCHMARKS.items():
        print(f"== bench {name}", file=sys.stderr)
        bench_args = parser.parse_known_args([name, *argv[1:]])[0]
        bench_args.threads = threads
        try:
            _run_one(module, bench_args, argv)
        except Exception:  # one broken benchmark must not hide the others' results
            traceback.print_exc()
            failed.append(name)
    print(f"wrote {write_readme(args.out, list(BENCHMARKS.values()))}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
