"""The sampler's draws follow the distribution its parameters define: temperature, top-k,
top-p (also when the nucleus is larger than the candidate set), min-p; seeded rows do not
depend on the batch. Statistical checks use thousands of rows and 5-sigma bounds."""
import torch

from paged_core.sample.sampler import _TOP_P_CANDIDATES, Sampler, SamplingRow
from paged_core.sampling_params import SamplingParams

DRAWS = 20000


def _rows(params: SamplingParams, count: int, seed_base: int | None = None) -> list[SamplingRow]:
    return [SamplingRow(params, None if seed_base is None else torch.Generator().manual_seed(seed_base + i),
                        [1], [], []) for i in range(count)]


def _frequencies(logits: torch.Tensor, params: SamplingParams, seed: int = 0) -> torch.Tensor:
    sampler = Sampler(torch.Generator().manual_seed(seed))
    tokens, _ = sampler(logits.expand(DRAWS, -1).clone(), _rows(params, DRAWS))
    return torch.bincount(torch.tensor(tokens), minlength=logits.shape[-1]).double() / DRAWS


def _assert_matches(freq: torch.Tensor, expected: torch.Tensor) -> None:
    assert bool((freq[expected == 0] == 0).all()), "a token outside the kept set was drawn"
    sigma = (expected * (1 - expected) / DRAWS).sqrt()
    assert bool(((freq - expected).abs() <= 5 * sigma + 1e-12).all()), (freq, expected)


LOGITS = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0, 0.7]])


def test_temperature_draws_follow_the_softmax():
    freq = _frequencies(LOGITS, SamplingParams(temperature=0.7))
    _assert_matches(freq, torch.softmax(LOGITS[0].double() / 0.7, dim=-1))


def test_top_k_keeps_the_k_best_renormalised():
    freq = _frequencies(LOGITS, SamplingParams(temperature=1.0, top_k=3))
    expected = torch.softmax(LOGITS[0].double(), dim=-1)
    expected[expected < expected.topk(3).values[-1]] = 0
    _assert_matches(freq, expected / expected.sum())


def test_top_p_keeps_the_nucleus_and_min_p_cuts_below_its_share_of_the_best():
    probs = torch.softmax(LOGITS[0].double(), dim=-1)
    order = probs.argsort(descending=True)
    mass_above = probs[order].cumsum(0) - probs[order]
    nucleus = torch.zeros_like(probs)
    nucleus[order[mass_above < 0.8]] = probs[order[mass_above < 0.8]]
    _assert_matches(_frequencies(LOGITS, SamplingParams(temperature=1.0, top_p=0.8)),
                    nucleus / nucleus.sum())
    kept = torch.where(probs >= 0.2 * probs.max(), probs, 0)
    _assert_matches(_frequencies(LOGITS, SamplingParams(temperature=1.0, min_p=0.2)),
                    kept / kept.sum())


def test_top_p_nucleus_larger_than_the_candidates():
    """A nearly flat distribution: the nucleus spans far more than the first candidates."""
    vocab = 3 * _TOP_P_CANDIDATES
    logits = torch.linspace(0.2, 0.0, vocab)[None, :]  # token i is the i-th most likely
    sampler = Sampler(torch.Generator().manual_seed(0))
    tokens, _ = sampler(logits.expand(4000, -1).clone(), _rows(SamplingParams(top_p=0.6), 4000))
    probs = torch.softmax(logits[0].double(), dim=-1)
    nucleus_size = int(((probs.cumsum(0) - probs) < 0.6).sum())
    assert nucleus_size > 1.5 * _TOP_P_CANDIDATES
    tokens = torch.tensor(tokens)
    assert int(tokens.max()) < nucleus_size  # never outside the nucleus
    assert int((tokens >= _TOP_P_CANDIDATES).sum()) > 1000  # and beyond the first candidates


def test_seeded_rows_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 5000, generator=gen) * 3
    seeded = SamplingParams(temperature=0.9, top_p=0.9, seed=7)
    alone = []
    for step in range(5):  # a few steps of one request's generator
        row = _rows(seeded, 1, seed_base=7)[0] if step == 0 else row
        alone.append(Sampler(torch.Generator().manual_seed(0))(logits[2:3].clone(), [row])[0][0])
    mixed = []
    for step in range(5):
        row = _rows(seeded, 1, seed_base=7)[0] if step == 0 else row
        companions = [SamplingRow(SamplingParams(temperature=1.3, top_k=2000), None, [1], [], []),
                      SamplingRow(SamplingParams(temperature=0), None, [1], [], [])]
        batch = [companions[0], companions[1], row]
        tokens, _ = Sampler(torch.Generator().manual_seed(step + 100))(
            torch.cat([logits[0:2], logits[2:3]]).clone(), batch)
        mixed.append(tokens[2])
        assert tokens[1] == int(logits[1].argmax())  # the greedy companion
    assert mixed == alone
