"""A seeded ShareGPT-like workload: varied prompt and output lengths with a long tail.

Prompt and output lengths are drawn from clipped lognormal distributions (the
shape of ShareGPT conversations: most requests short, a few long). Prompts are
windows of real English text (the docstrings of Python's standard library,
tokenized by the model's tokenizer), so attention sees natural token
statistics rather than uniform noise. Output lengths are exact: every system
generates exactly ``output_len`` tokens (``ignore_eos`` + ``max_tokens``).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import random
import warnings
from dataclasses import dataclass

# Standard-library modules whose docstrings make the text corpus (deterministic per Python version).
_TEXT_MODULES = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email",
                 "functools", "http.client", "inspect", "itertools", "json", "logging",
                 "pathlib", "pickle", "re", "socket", "statistics", "subprocess", "threading",
                 "typing", "unittest", "urllib.request", "zipfile")


@dataclass(frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


# Two tiny requests every system runs once before it is timed.
WARMUP = [BenchRequest(list(range(1000, 1032)), 4), BenchRequest(list(range(2000, 2016)), 4)]


@dataclass(frozen=True)
class WorkloadSpec:
    """Lengths are drawn lognormal around ``*_median`` with spread ``sigma``, clipped to ``[lo, hi]``."""

    # Defaults: `bench throughput` (paged-core + both transformers baselines) measured 8.5 min
    # on a shared 2-core EPYC; longer medians push naive static batching past 10 min.
    num_requests: int = 100
    prompt_median: int = 64
    prompt_range: tuple[int, int] = (16, 1024)
    output_median: int = 32
    output_range: tuple[int, int] = (16, 512)
    sigma: float = 0.9
    seed: int = 0


# ``bench throughput --workload NAME``: the default ShareGPT-like mix, and the long-tailed
# mix of issue 11 (median prompt ~100 tokens up to 512, median output ~75 up to 256).
LONG_TAIL = WorkloadSpec(num_requests=64, prompt_median=100, prompt_range=(8, 512),
                         output_median=75, output_range=(8, 256))
WORKLOADS = {"sharegpt": WorkloadSpec(), "long-tail": LONG_TAIL,
             "long-tail-512": dataclasses.replace(LONG_TAIL, num_requests=512)}

# The ``--quick`` size of every benchmark (CI smoke tests): a handful of short requests.
QUICK = WorkloadSpec(num_requests=8, prompt_median=24, prompt_range=(8, 64), output_median=8,
                     output_range=(4, 24))


def corpus_text() -> str:
    """Docstrings of a fixed set of standard-library modules and their public members."""
    parts: list[str] = []
    with warnings.catch_warnings():  # some members (typing.io, ...) warn on access
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _TEXT_MODULES:
            module = importlib.import_module(name)
            parts.append(inspect.getdoc(module) or "")
            for attr in sorted(dir(module)):
                if not attr.startswith("_"):
                    doc = inspect.getdoc(getattr(module, attr, None))
                    if doc and len(doc) > 80:
                        parts.append(doc)
    return "\n\n".join(dict.fromkeys(p for p in parts if p))  # drop repeats, keep order


def corpus_token_ids(tokenizer) -> list[int]:
    return tokenizer.encode(corpus_text(), add_special_tokens=False)


def _lognormal_len(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def text_window(tokens: list[int], rng: random.Random, length: int) -> list[int]:
    """``length`` consecutive corpus tokens from a random offset (wrapping around)."""
    start = rng.randrange(len(tokens))
    return [tokens[(start + i) % len(tokens)] for i in range(length)]


def sharegpt_like(spec: WorkloadSpec, tokenizer) -> list[BenchRequest]:
    """``spec.num_requests`` requests with seeded lengths and text prompts."""
    rng = random.Random(spec.seed)
    tokens = corpus_token_ids(tokenizer)
    requests = []
    for _ in range(spec.num_requests):
        prompt_len = _lognormal_len(rng, spec.prompt_median, spec.sigma, *spec.prompt_range)
        output_len = _lognormal_len(rng, spec.output_median, spec.sigma, *spec.output_range)
        requests.append(BenchRequest(text_window(tokens, rng, prompt_len), output_len))
    return requests


def summarize(requests: list[BenchRequest]) -> dict[str, float]:
    """Sizes of a workload, for the result files."""
    prompts = [r.prompt_len for r in requests]
    outputs = [r.output_len for r in requests]
    return {
        "num_requests": len(requests),
        "prompt_tokens": sum(prompts), "output_tokens": sum(outputs),
        "prompt_len_min": min(prompts), "prompt_len_mean": sum(prompts) / len(prompts),
        "prompt_len_max": max(prompts),
        "output_len_min": min(outputs), "output_len_mean": sum(outputs) / len(outputs),
        "output_len_max": max(outputs),
    }


@functools.lru_cache(maxsize=1)
def embedded_tokenizer():
    """The tokenizer of the embedded SmolLM2-135M-Instruct (loaded once per process)."""
    from transformers import AutoTokenizer

    from paged_core.models.embedded_model import embedded_model_folder

    return AutoTokenizer.from_pretrained(embedded_model_folder())
