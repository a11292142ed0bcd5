"""``paged-core`` command line: ``generate``, ``serve``, ``triton-repo``, ``bench``.

Engine flags (``--model``, ``--dtype``, ``--block-size``, ...) are the
``EngineConfig`` fields; unset ones fall back to ``PAGED_CORE_*`` variables.
"""
from __future__ import annotations

import argparse
import json
import sys

from .config import EngineConfig
from .config.engine_config import field_types


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``EngineConfig`` field; a true-or-false one also stands alone, as vLLM's
    do (``--enforce-eager`` is ``--enforce-eager true``)."""
    group = parser.add_argument_group("engine (EngineConfig fields; default from PAGED_CORE_*)")
    for name, kind in field_types().items():
        flag = name.replace("_", "-")
        if flag == "seed":  # --seed is the per-request sampling seed
            flag = "engine-seed"
        switch = {"nargs": "?", "const": "true"} if kind in (bool, bool | None) else {}
        group.add_argument("--" + flag, dest=f"engine_{name}", default=None,
                           metavar=name.upper(), **switch)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """Flags given on the command line win over ``PAGED_CORE_*`` variables."""
    given = {k.removeprefix("engine_"): v for k, v in vars(args).items()
             if k.startswith("engine_") and v is not None}
    typed = EngineConfig.from_strings(given)
    return EngineConfig.from_env(**{k: getattr(typed, k) for k in given})


def _cmd_generate(args: argparse.Namespace) -> int:
    from .llm import LLM
    from .sampling_params import SamplingParams

    config = engine_config(args)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                            top_p=args.top_p, seed=args.seed, n=args.n)
    with LLM(**config.__dict__) as llm:
        if args.chat:
            outputs = llm.chat([{"role": "user", "content": p} for p in args.prompt][:1], params,
                               use_tqdm=False)
        else:
            outputs = llm.generate(list(args.prompt), params, use_tqdm=len(args.prompt) > 8)
        stats = llm.stats()
    for out in outputs:
        for completion in out.outputs:
            if args.json:
                print(json.dumps({"prompt": out.prompt, "index": completion.index,
                                  "text": completion.text, "token_ids": completion.token_ids,
                                  "finish_reason": completion.finish_reason}))
            else:
                print(f"{out.prompt or ''}{completion.text}")
    if args.stats:
        print(json.dumps(stats.as_dict()), file=sys.stderr)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from .adapters.launch import serve

    serve(args.adapter, args.host, args.port, engine_config(args))
    return 0


def _cmd_serve_cluster(args: argparse.Namespace) -> int:
    from .adapters.cluster import serve_cluster

    serve_cluster(engine_config(args), args.replicas, args.adapter, args.policy, args.host,
                  args.port, args.session_affinity_ttl)
    return 0


def _cmd_triton_repo(args: argparse.Namespace) -> int:
    from .adapters.triton_server import write_repository

    path = write_repository(args.out, engine_config(args), model_name=args.model_name)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged-core", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for prompts with the offline engine")
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--chat", action="store_true", help="wrap the first prompt in the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object per completion")
    gen.add_argument("--stats", action="store_true", help="print engine stats to stderr")
    _add_engine_flags(gen)
    gen.set_defaults(func=_cmd_generate)

    srv = sub.add_parser("serve", help="serve the OpenAI API through a serving framework")
    srv.add_argument("--adapter", choices=("bentoml", "litserve", "triton"), default="bentoml")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    _add_engine_flags(srv)
    srv.set_defaults(func=_cmd_serve)

    from .adapters.cluster.router import POLICIES

    cluster = sub.add_parser(
        "serve-cluster", help="serve N replicas behind vllm-router's prefix-aware routing",
        description="Start --replicas servers (each publishing its KV-cache events) and "
                    "vllm-router in front of them (pip install 'paged-core[router]'); the "
                    "OpenAI API is at the router's --host/--port. Ctrl-C stops everything.")
    cluster.add_argument("--replicas", type=int, default=2)
    cluster.add_argument("--adapter", choices=("bentoml", "litserve"), default="litserve")
    cluster.add_argument("--policy", default="kv_aware", choices=POLICIES,
                         help="vllm-router's routing policy (kv_aware: by the replicas' KV events)")
    cluster.add_argument("--session-affinity-ttl", type=int, default=None, metavar="SECONDS",
                         help="kv_aware only: keep requests with one x-session-id header on "
                              "one replica while that session is idle less than this")
    cluster.add_argument("--host", default="127.0.0.1")
    cluster.add_argument("--port", type=int, default=8000)
    _add_engine_flags(cluster)
    cluster.set_defaults(func=_cmd_serve_cluster)

    repo = sub.add_parser("triton-repo", help="write a Triton Inference Server model repository")
    repo.add_argument("--out", required=True)
    repo.add_argument("--model-name", default="paged_llm")
    _add_engine_flags(repo)
    repo.set_defaults(func=_cmd_triton_repo)

    bench = sub.add_parser("bench", help="benchmarks (see benchmarks/README.md)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=lambda a: _run_bench(a.bench_args))
    return parser


def _run_bench(argv: list[str]) -> int:
    from .bench.cli import main as bench_main

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"paged-core: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
