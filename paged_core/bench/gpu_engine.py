"""Engine timings on a GPU for ``benchmarks/gpu_suite.py``: random-weight Llama-3.2-1B- and
Llama-3.1-8B-shaped models in bfloat16 (no hub on the GPU machine; random weights drawn on
the card, never zeros).

- ``decode_step_times``: one decode step at batches 1/16/64/256 (prompts of ``context``
  tokens) under each of ``STEP_MODES`` (eagerly; replaying CUDA graphs; graphs with
  ``async_scheduling``, with and without ``schedule_ahead``), against the HBM roofline: the
  weight bytes plus the KV bytes a step reads, over the measured copy bandwidth. A step's
  time is the difference of two ``generate`` calls, ``max_tokens`` 8 and 8 + ``steps``, over
  ``steps`` (the prefill, and its absent prefix cache, cancel out);
- ``host_profile``: where the host's time goes in decode steps with CUDA graphs (cProfile's
  functions by own time), the work that the GPU waits on between graph replays;
- ``kernel_breakdown``: the kernels inside one decode graph's replay (the profiler's device
  events): launches and device time per kernel name, their sum against the replay's span
  (what is left is the gaps between kernels);
- ``offline_mix``: a long-tailed mix of 512 requests (``bench.workload.LONG_TAIL``) through
  paged-core under each of ``MIX_MODES`` (its defaults, CUDA graphs for every step that fits
  one with ``async_scheduling`` and ``schedule_ahead``; without ``schedule_ahead``; the same
  one step at a time; the step limits of earlier runs, 256 sequences and 8192 tokens; graphs
  for decode steps only, ``cudagraph_mode="FULL_DECODE_ONLY"``, each way), transformers'
  static batching (``generate`` over padded batches of 256, or of 512: every request at
  once) and transformers' continuous batching (``generate_batch``'s manager), output tokens
  per second; for paged-core also its steps and the seconds the host sat waiting for the
  GPU's tokens (``host_waits``: where that is a small part of the run, the host's own work
  sets the pace).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time

import torch

SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         tie_word_embeddings=False),
}
# Engine settings each timing runs under, by name ("graphs-ahead" and "paged-core": the
# defaults, ``"FULL"`` graphs with ``async_scheduling`` and ``schedule_ahead``; "...-async":
# ``async_scheduling`` alone, each step scheduled once the one before it is back; the others
# one step at a time)
_ONE_STEP_AT_A_TIME = {"async_scheduling": False}
_ASYNC_ONLY = {"schedule_ahead": False}
STEP_MODES = {"eager": {"enforce_eager": True, **_ONE_STEP_AT_A_TIME},
              "graphs": _ONE_STEP_AT_A_TIME, "graphs-async": _ASYNC_ONLY, "graphs-ahead": {}}
_DECODE_GRAPHS = {"cudagraph_mode": "FULL_DECODE_ONLY"}
# "paged-core-256": the step limits of runs 1-11 (before the defaults followed the card: 1024
# sequences and 16384 tokens on an H100 or H200, ``config.batch_limits``); "...-capture-256":
# graphs for steps of up to 256 sequences or tokens (the default: 512, vLLM's)
MIX_MODES = {"paged-core": {}, "paged-core-sync": _ONE_STEP_AT_A_TIME,
             "paged-core-256": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
             "paged-core-capture-256": {"max_cudagraph_capture_size": 256},
             "paged-core-async": _ASYNC_ONLY,
             "paged-core-decode-graphs": {**_DECODE_GRAPHS, **_ONE_STEP_AT_A_TIME},
             "paged-core-decode-graphs-async": {**_DECODE_GRAPHS, **_ASYNC_ONLY}}
_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def random_model(shape: str, folder: str, tokenizer) -> str:
    """A ``shape`` Llama with weights drawn on the GPU (transformers' own init), saved as a
    bfloat16 safetensors folder with ``tokenizer``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                         rope_parameters=_ROPE, bos_token_id=128000, eos_token_id=128001,
                         **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    _release()
    return folder


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _weight_bytes(llm) -> int:
    model = llm.engine.core.executor.runner.model
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _replay_ms(llm, batch: int) -> float | None:
    """GPU time of one replay of the decode graph serving ``batch`` (its buffers still hold the
    last step's inputs): the step's time less this is host work."""
    import triton.testing

    graphs = llm.engine.core.executor.runner.cuda_graphs
    if graphs is None:
        return None
    size = next(s for s in graphs.sizes if s >= batch)
    return float(triton.testing.do_bench(graphs.graphs[False, size].replay, warmup=10, rep=50,
                                         return_mode="median"))


def decode_step_times(folder: str, copy_gb_per_s: float, *, batches=(1, 16, 64, 256),
                      context: int = 512, steps: int = 64,
                      modes=tuple(STEP_MODES)) -> list[dict]:
    """Rows of ``{"mode", "batch", "step_ms", "roofline_ms", ...}`` per mode (``STEP_MODES``)
    and batch, then one ``{"mode", "engine"}`` row of memory figures per mode."""
    from paged_core import LLM, SamplingParams

    rows = []
    for mode in modes:
        llm = LLM(model=folder, device="cuda", dtype="bfloat16", enable_prefix_caching=False,
                  max_num_seqs=max(batches), max_model_len=4096, max_num_batched_tokens=8192,
                  gpu_memory_utilization=0.85, **STEP_MODES[mode])
        spec = llm.engine.core.executor.runner.model.spec
        kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
        weights = _weight_bytes(llm)
        for batch in batches:
            prompts = [{"prompt_token_ids": [1000 + (7 * i + j) % 30000 for j in range(context)]}
                       for i in range(batch)]
            times = {}
            for new in (8, 8 + steps):
                params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
                llm.generate(prompts, params, use_tqdm=False)  # warm-up at this shape
                torch.cuda.synchronize()
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                torch.cuda.synchronize()
                times[new] = time.perf_counter() - start
            step_ms = (times[8 + steps] - times[8]) / steps * 1e3
            step_bytes = weights + batch * (context + 8 + steps // 2) * kv_per_token
            roofline_ms = step_bytes / copy_gb_per_s / 1e6
            rows.append({"mode": mode, "batch": batch, "step_ms": step_ms,
                         "roofline_ms": roofline_ms, "over_roofline": step_ms / roofline_ms,
                         "graph_replay_ms": _replay_ms(llm, batch)})
        stats = {"kv_blocks_total": llm.stats()["kv_blocks_total"],
                 "max_memory_reserved_gb": torch.cuda.max_memory_reserved() / 1e9}
        rows.append({"mode": mode, "engine": stats})
        llm.shutdown()
        del llm
        _release()
    return rows


def kernel_breakdown(folder: str, *, batch: int = 1, context: int = 512, replays: int = 20,
                     top: int = 25) -> dict:
    """The kernels of the decode graph serving ``batch`` (``cudagraph_mode="FULL"``), after a
    ``generate`` over prompts of ``context`` tokens left real inputs in its buffers: per kernel
    name its launches and device microseconds per replay (``top`` names by time), the sum of
    every kernel's time and the span from the first kernel's start to the last one's end, per
    replay. ``span - kernels`` is the time the GPU spent between kernels."""
    from torch.profiler import ProfilerActivity, profile

    from paged_core import LLM, SamplingParams

    llm = LLM(model=folder, device="cuda", dtype="bfloat16", enable_prefix_caching=False,
              max_num_seqs=max(batch, 16), max_model_len=4096, max_num_batched_tokens=8192)
    prompts = [{"prompt_token_ids": [1000 + (7 * i + j) % 30000 for j in range(context)]}
               for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                 use_tqdm=False)
    graphs = llm.engine.core.executor.runner.cuda_graphs
    size = next(s for s in graphs.sizes if s >= batch)
    graph = graphs.graphs[False, size]
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    llm.shutdown()
    del llm, graph, graphs
    _release()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"batch": batch, "error": "the profiler recorded no device events"}
    kernels.sort(key=lambda e: e.time_range.start)
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name, []).append(event.time_range.elapsed_us())
    per_replay = len(kernels) // replays  # replays run back to back: cut them apart in order
    span_us = sum(kernels[i + per_replay - 1].time_range.end - kernels[i].time_range.start
                  for i in range(0, per_replay * replays, per_replay))
    rows = sorted(by_name.items(), key=lambda item: -sum(item[1]))
    return {"batch": batch, "graph_rows": size, "replays": replays,
            "kernels_per_replay": len(kernels) / replays,
            "kernel_us_per_replay": sum(sum(t) for t in by_name.values()) / replays,
            "span_us_per_replay": span_us / replays,
            "kernels": [{"name": name[:160], "launches_per_replay": len(times) / replays,
                         "us_per_replay": sum(times) / replays}
                        for name, times in rows[:top]]}


def host_profile(folder: str, *, batch: int = 256, context: int = 512, steps: int = 32,
                 top: int = 40) -> dict:
    """cProfile of ``steps`` decode steps of ``batch`` sequences (CUDA graphs on): the step
    time, and the ``top`` functions by own time with their calls and seconds per step."""
    import cProfile
    import pstats

    from paged_core import LLM, SamplingParams

    llm = LLM(model=folder, device="cuda", dtype="bfloat16", enforce_eager=False,
              enable_prefix_caching=False, max_num_seqs=batch, max_model_len=4096,
              max_num_batched_tokens=8192)
    prompts = [{"prompt_token_ids": [1000 + (7 * i + j) % 30000 for j in range(context)]}
               for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up at this shape
    profile = cProfile.Profile()
    torch.cuda.synchronize()
    start = time.perf_counter()
    profile.enable()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    profile.disable()
    seconds = time.perf_counter() - start
    llm.shutdown()
    del llm
    _release()
    stats = pstats.Stats(profile).stats  # (file, line, name) -> (calls, _, own s, cumulative s, _)
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {"batch": batch, "steps": steps, "profiled_ms_per_step": seconds / steps * 1e3,
            "functions": [{"function": f"{file}:{line}({name})", "calls": calls,
                           "own_ms_per_step": own / steps * 1e3,
                           "cumulative_ms_per_step": cumulative / steps * 1e3}
                          for (file, line, name), (_, calls, own, cumulative, _) in rows]}


def _paged_core_mix(folder: str, requests, settings: dict) -> dict:
    from paged_core import LLM, SamplingParams

    llm = LLM(model=folder, device="cuda", dtype="bfloat16", max_model_len=4096, **settings)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)
              for r in requests]
    # Warm-up: every prompt with a few new tokens, so the Triton kernels of every prefill shape
    # the mix meets are compiled before the clock starts (with only a few prompts, the first
    # mode timed in a process paid those compiles: 15,210 against 21,448 tok/s the mode after
    # it, H200, 2026-11-27).
    llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=min(16, r.output_len),
                                          ignore_eos=True) for r in requests], use_tqdm=False)
    llm.reset_prefix_cache()
    torch.cuda.synchronize()
    with host_waits() as waits:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    memory = {"max_num_seqs": llm.engine.config.max_num_seqs,
              "max_num_batched_tokens": llm.engine.config.max_num_batched_tokens,
              **_graph_stats(llm),
              "gpu_memory_utilization": llm.engine.config.gpu_memory_utilization,
              "peak_fraction_of_card": _peak_fraction()}
    llm.shutdown()
    del llm
    _release()
    return {"seconds": seconds, "output_tokens": generated, **waits, **memory}


@contextlib.contextmanager
def host_waits():
    """Counts, while open, the steps whose sampled tokens the host waited for
    (``PendingTokens.tolist``: ``steps``) and the seconds it sat blocked there
    (``host_waited_s``): a run whose host seldom waits is bound by the host's own work."""
    from ..sample.pending_tokens import PendingTokens

    record = {"steps": 0, "host_waited_s": 0.0}
    untimed = PendingTokens.tolist

    def timed(self):
        start = time.perf_counter()
        try:
            return untimed(self)
        finally:
            record["steps"] += 1
            record["host_waited_s"] += time.perf_counter() - start

    PendingTokens.tolist = timed
    try:
        yield record
    finally:
        PendingTokens.tolist = untimed


def _graph_stats(llm) -> dict:
    """What the engine's CUDA graphs served. (No reference to them may outlive ``llm``: they
    hold its KV cache, which must be freed before the next engine sizes its own.)"""
    graphs = llm.engine.core.executor.runner.cuda_graphs
    return {"cudagraph_mode": llm.engine.config.cudagraph_mode,
            "async_scheduling": llm.engine.config.async_scheduling,
            "schedule_ahead": llm.engine.config.schedule_ahead,
            "graph_pool_mib": graphs.pool_bytes / 2**20, "decode_graph_steps": graphs.replays,
            "other_graph_steps": graphs.mixed_replays}


def _peak_fraction() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / total


def _hf_static(model, requests, batch_size: int) -> dict:
    """Padded batches of ``batch_size`` in arrival order, each to its longest output."""
    generated, start = 0, time.perf_counter()
    for first in range(0, len(requests), batch_size):
        chunk = requests[first:first + batch_size]
        width = max(r.prompt_len for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(chunk):  # left padding
            ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[row, width - r.prompt_len:] = 1
        longest = max(r.output_len for r in chunk)
        with torch.no_grad():
            model.generate(ids.cuda(), attention_mask=mask.cuda(), do_sample=False,
                           max_new_tokens=longest, min_new_tokens=longest, pad_token_id=0)
        generated += sum(r.output_len for r in chunk)  # only the tokens asked for count
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start, "output_tokens": generated,
            "batch_size": batch_size}


def _hf_continuous(model, requests) -> dict:
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(r.output_len for r in requests),
                              pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    start = time.perf_counter()
    for i, r in enumerate(requests):
        manager.add_request(r.prompt_token_ids, request_id=str(i), max_new_tokens=r.output_len)
    generated, done = 0, 0
    while done < len(requests):
        result = manager.get_result(timeout=60)
        if result is None:
            raise TimeoutError(f"transformers continuous batching stalled after {done} requests")
        if result.is_finished():
            done += 1
            generated += len(result.generated_tokens)
    seconds = time.perf_counter() - start
    manager.stop(block=True)
    return {"seconds": seconds, "output_tokens": generated}


def offline_mix(folder: str, tokenizer, num_requests: int = 512, hf_static_batch: int = 256,
                modes=tuple(MIX_MODES),
                baselines=("transformers-static", "transformers-continuous")) -> dict:
    """Output tok/s of each system on the mix: paged-core under ``modes`` (names of
    ``MIX_MODES``, its default first), then ``baselines``; each baseline's
    ``paged_core_speedup`` is paged-core's (default settings) over it,
    ``best_paged_core_speedup`` that of its fastest mode. A system that fails is reported, not
    fatal."""
    from transformers import AutoModelForCausalLM

    from .workload import LONG_TAIL, sharegpt_like, summarize

    requests = sharegpt_like(dataclasses.replace(LONG_TAIL, num_requests=num_requests), tokenizer)
    results = {"workload": summarize(requests),
               **{name: _reported(lambda: _paged_core_mix(folder, requests, MIX_MODES[name]))
                  for name in modes}}
    # use_kernels=False: transformers >= 5.25 would fetch Hugging Face hub kernels on CUDA by
    # default, which an offline GPU machine cannot; the baseline is transformers' own modules.
    # A load that fails is each baseline's error (paged-core's results above are kept).
    loaded = _reported(lambda: {"model": AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, device_map="cuda", use_kernels=False).eval()}
                       ) if baselines else {}
    model = loaded.get("model")
    hf_runners = {"transformers-static": lambda: _hf_static(model, requests, hf_static_batch),
                  "transformers-static-512": lambda: _hf_static(model, requests, 512),
                  "transformers-continuous": lambda: _hf_continuous(model, requests)}
    for name in baselines:
        results[name] = (_reported(hf_runners[name]) if model is not None
                         else {"error": f"loading the model: {loaded['error']}"})
    model = loaded = None  # frees the baselines' weights
    _release()
    for result in results.values():
        if "seconds" in result:
            result["output_tok_per_s"] = result["output_tokens"] / result["seconds"]
    ours = results.get("paged-core", {}).get("output_tok_per_s")
    best = max((results[name].get("output_tok_per_s", 0) for name in modes), default=0)
    for name in baselines:
        theirs = results[name].get("output_tok_per_s")
        if ours and theirs:
            results[name]["paged_core_speedup"] = ours / theirs
            results[name]["best_paged_core_speedup"] = best / theirs
    return results


def _reported(run) -> dict:
    """``run()``'s result, or ``{"error": ...}`` if it raised."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - one system's failure is a result, not fatal
        _release()
        return {"error": f"{type(exc).__name__}: {exc}"}
