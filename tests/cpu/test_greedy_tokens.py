"""The C++ greedy token pick (``csrc/greedy_tokens.cpp``) on every CPU path: exactly
``torch.argmax(dim=-1)``, ties, NaN and infinities included, and the sampler takes it."""
import pytest
import torch

from paged_core.cpu.extension import cpu_ops


def test_every_row_matches_torch_argmax(cpu_isa):
    gen = torch.Generator().manual_seed(0)
    for rows, vocab in ((1, 1), (3, 7), (5, 256), (9, 257), (46, 49152)):
        logits = torch.randn(rows, vocab, generator=gen)
        assert torch.equal(cpu_ops(cpu_isa).greedy_tokens(logits), logits.argmax(dim=-1))


def test_bfloat16_rows_match_their_float32_copy(cpu_isa):
    gen = torch.Generator().manual_seed(1)
    for rows, vocab in ((1, 1), (3, 7), (9, 257), (46, 49152)):
        logits = torch.randn(rows, vocab, generator=gen).bfloat16()  # coarse: many ties
        assert torch.equal(cpu_ops(cpu_isa).greedy_tokens(logits), logits.float().argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_nan_and_infinities_follow_torch(cpu_isa, dtype):
    logits = torch.full((6, 1000), -1.0)
    logits[0, [700, 300, 900]] = 5.0                      # ties: the first
    logits[1, [10, 600]] = float("nan")                  # NaN beats any number: the first NaN
    logits[1, 5] = float("inf")
    logits[2] = float("-inf")                            # every token blocked: index 0
    logits[3, 999] = float("inf")                        # last column
    logits[4, 256] = 2.0                                 # first value of the second block
    logits[5, [255, 256]] = 3.0                          # a tie across a block edge
    expected = logits.argmax(dim=-1)
    assert expected.tolist() == [300, 10, 0, 999, 256, 255]
    assert torch.equal(cpu_ops(cpu_isa).greedy_tokens(logits.to(dtype)), expected)


def test_a_strided_view_and_bad_dtypes(cpu_isa):
    ops = cpu_ops(cpu_isa)
    logits = torch.randn(8, 600)
    assert torch.equal(ops.greedy_tokens(logits[::2, 100:]), logits[::2, 100:].argmax(dim=-1))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.greedy_tokens(logits.half())
    with pytest.raises(RuntimeError, match="at least one column"):
        ops.greedy_tokens(torch.empty(2, 0))


def test_the_sampler_picks_greedy_tokens_with_it(monkeypatch):
    from paged_core import SamplingParams
    from paged_core.sample import sampler

    seen = []
    kernel = sampler._cpu_greedy_kernel()
    assert kernel is not None  # the kernels build on every host this suite runs on
    monkeypatch.setattr(sampler, "_cpu_greedy_kernel",
                        lambda: lambda logits: seen.append(logits.shape) or kernel(logits))
    logits = torch.randn(4, 300)
    logits[2, 17] = 50.0
    rows = [sampler.SamplingRow(SamplingParams(temperature=0), None, [1], [], []) for _ in range(4)]
    tokens, _ = sampler.Sampler()(logits, rows)
    assert seen == [(4, 300)]
    assert tokens == logits.argmax(dim=-1).tolist() and tokens[2] == 17


def test_plain_greedy_steps_skip_the_float32_copy(monkeypatch):
    """A step of plain greedy rows hands the LM head's bfloat16 logits to the kernel as they
    are; a row that changes its logits first (a blocked token) makes the step sample a float32
    copy, and the blocked token is not picked although it is the largest."""
    from paged_core import SamplingParams
    from paged_core.sample import sampler

    seen = []
    kernel = sampler._cpu_greedy_kernel()
    monkeypatch.setattr(sampler, "_cpu_greedy_kernel",
                        lambda: lambda logits: seen.append(logits.dtype) or kernel(logits))
    logits = torch.randn(3, 500).bfloat16()
    logits[:, 41] = 30.0
    logits[:, 7] = 20.0
    plain = sampler.SamplingRow(SamplingParams(temperature=0), None, [1], [], [])
    tokens, logprobs = sampler.Sampler()(logits, [plain] * 3)
    assert seen == [torch.bfloat16] and tokens == [41, 41, 41] and logprobs == [None] * 3
    blocked = sampler.SamplingRow(SamplingParams(temperature=0), None, [1], [], [41])
    tokens, _ = sampler.Sampler()(logits, [plain, blocked, plain])
    assert seen[1:] == [torch.float32] and tokens == [41, 7, 41]
    assert logits[1, 41] == 30.0  # the float32 copy took the block, not the LM head's rows
