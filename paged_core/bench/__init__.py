"""``paged-core bench``: side-by-side measurements of the engine, written as JSON + PNG.

Subcommands (``paged-core bench <name> [--quick] [--out DIR]``; a run writes only inside
``DIR``, ``benchmarks`` by default: ``DIR/results/`` and ``DIR/README.md``):

- ``throughput``: offline generation against naive ``transformers`` static
  batching, ``transformers`` continuous batching (``generate_batch``) and,
  given ``--vllm-python``, vLLM's CPU build;
- ``serve``: online latency (TTFT, inter-token, end-to-end) under Poisson
  arrivals and a burst, through an adapter's OpenAI endpoint;
- ``memory``: KV-cache waste of paged blocks against contiguous pre-allocation;
- ``prefix``: time to first token with a shared system prompt, prefix caching on and off;
- ``sharing``: KV blocks of parallel sampling (``n > 1``) against ``n`` independent requests;
- ``tp``: tensor parallelism: weight and KV bytes per rank, step time, communication share;
- ``attention``: the C++ CPU attention per CPU path level against the memory bandwidth
  and linear FLOP rate measured in the same run;
- ``quality``: perplexity per weight format and KV cache dtype, next to bfloat16;
- ``all``: every benchmark, then ``DIR/README.md`` regenerated from the results.
"""
