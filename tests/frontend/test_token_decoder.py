"""``token_decoder`` gives the tokenizer's own ``decode`` text, through the Rust library
where that is all the tokenizer adds, and through ``decode`` where a tokenizer changes it."""
import random

import pytest

from paged_core.frontend.token_decoder import token_decoder

TEXT = "Grüße aus Köln! 東京タワーは高い。 Emoji: 🚀🎉  spaces , before . punctuation"


def _id_lists(tokenizer):
    rng = random.Random(0)
    specials = list(tokenizer.all_special_ids)
    text_ids = tokenizer.encode(TEXT)
    yield text_ids
    yield []
    for _ in range(200):  # random ids, special ones mixed in, cut anywhere (half characters)
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 12))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        yield ids
        start = rng.randrange(len(text_ids))
        yield text_ids[start:start + rng.randrange(1, 6)]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_the_text_is_the_tokenizers_decode(tokenizer, skip_special_tokens):
    decode = token_decoder(tokenizer, skip_special_tokens)
    assert decode.__name__ == "decode_in_backend"  # the embedded model's tokenizer is plain
    for ids in _id_lists(tokenizer):
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_a_tokenizer_that_changes_decode_keeps_its_own(tokenizer):
    class Shouting(type(tokenizer)):
        def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
            return super()._decode(token_ids, skip_special_tokens, **kwargs).upper()

    shouting = Shouting.__new__(Shouting)
    shouting.__dict__.update(tokenizer.__dict__)
    decode = token_decoder(shouting, True)
    ids = tokenizer.encode(TEXT)
    assert decode(ids) == tokenizer.decode(ids).upper() == shouting.decode(ids)


def test_space_clean_up_keeps_the_tokenizers_decode(tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer, "clean_up_tokenization_spaces", True)
    decode = token_decoder(tokenizer, True)
    assert decode.__name__ == "decode_by_tokenizer"
    ids = tokenizer.encode(TEXT)
    assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)
