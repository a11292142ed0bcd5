"""Incremental detokenization: streamed pieces concatenate to the full decode, never half a character."""
from paged_core.frontend.detokenizer import IncrementalDetokenizer

TEXT = "Grüße aus Köln! 東京タワーは高い。 Emoji: 🚀🎉 done — ok"


def test_streamed_deltas_equal_full_decode_with_multibyte(tokenizer):
    prompt = tokenizer.encode("Say:")
    output = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
    tokens = list(prompt)
    pieces = []
    for i, t in enumerate(output):
        tokens.append(t)
        pieces.append(detok.step(tokens, len(tokens), final=i == len(output) - 1))
    assert "".join(pieces) == tokenizer.decode(output)
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p == "") > 0  # some tokens were half characters, held back


def test_special_tokens_are_skipped(tokenizer):
    eos = tokenizer.eos_token_id
    tokens = tokenizer.encode("Hi") + tokenizer.encode(" there") + [eos]
    detok = IncrementalDetokenizer(tokenizer, tokens[:1], skip_special_tokens=True)
    text = "".join(detok.step(tokens, i + 1) for i in range(1, len(tokens)))
    assert text == tokenizer.decode(tokens[1:], skip_special_tokens=True)
