"""The fast encode / decode paths must equal transformers' results (the naive reference)."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models

from loomrl.codec import fast_decoder, fast_encoder


@pytest.fixture(scope="module")
def extended_tokenizer(tokenizer):
    """The default tokenizer with added tokens, one special and one written with spaces."""
    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<think>", "</think>", "two words"])
    tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    return tok


@pytest.mark.parametrize("skip_special_tokens", [False, True])
@pytest.mark.parametrize("which", ["tokenizer", "extended_tokenizer"])
def test_fast_decoder_matches_the_tokenizers_decode(request, which, skip_special_tokens):
    tokenizer = request.getfixturevalue(which)
    rng = random.Random(0)
    decode = fast_decoder(tokenizer, skip_special_tokens=skip_special_tokens)
    specials = list(tokenizer.all_special_ids)
    for _ in range(2000):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(0, 40))]
        ids[rng.randrange(len(ids) + 1) : 0] = rng.sample(specials, 1)  # always a special
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert decode(ids) == expected, ids


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
def test_fast_decoder_replaces_broken_utf8_as_rust_does(tokenizer, data):
    """Byte tokens of cut or invalid UTF-8 (a model can emit half an emoji) decode to the
    same replacement characters as the Rust decoder."""
    byte_ids = [tokenizer.convert_tokens_to_ids(_byte_token(b)) for b in data]
    decode = fast_decoder(tokenizer, skip_special_tokens=False)
    assert decode(byte_ids) == tokenizer.decode(byte_ids, skip_special_tokens=False)


def test_fast_decoder_handles_ids_outside_the_vocabulary_like_the_tokenizer(tokenizer):
    decode = fast_decoder(tokenizer, skip_special_tokens=False)
    hello = tokenizer.encode("hello", add_special_tokens=False)
    beyond = [len(tokenizer) + 5, *hello]
    assert decode(beyond) == tokenizer.backend_tokenizer.decode(beyond, skip_special_tokens=False)
    with pytest.raises(OverflowError):  # as the Rust decoder does; never a wrapped-around id
        decode([-1, *hello])
    assert decode(tuple(hello)) == "hello"


def test_fast_decoder_uses_rust_for_tokenizers_that_are_not_byte_level():
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.decoder = decoders.WordPiece()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    decode = fast_decoder(tokenizer, skip_special_tokens=False)
    assert decode([0, 1, 0]) == tokenizer.decode([0, 1, 0]) == "a b a"


@pytest.mark.parametrize("which", ["tokenizer", "extended_tokenizer"])
def test_fast_encoder_matches_the_tokenizers_encode(request, which):
    tokenizer = request.getfixturevalue(which)
    encode = fast_encoder(tokenizer)
    rng = random.Random(1)
    pieces = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "user", "\n", " ", "é"]
    pieces += ["Hello", " world", "42", "  ", "\t", "ünï", "😀", "assistant", "two words"]
    texts = ["", "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>assistant\n"]
    for _ in range(300):
        texts.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30))))
    for text in texts:
        assert encode(text) == tokenizer.encode(text, add_special_tokens=False), text


def _byte_token(byte: int) -> str:
    """The byte-level BPE token that stands for one raw byte (GPT-2's printable shift)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if byte in printable:
        return chr(byte)
    return chr(256 + sorted(set(range(256)) - set(printable)).index(byte))


def test_tokens_added_after_a_first_decoder_are_decoded(tokenizer):
    tok = copy.deepcopy(tokenizer)
    fast_decoder(tok, skip_special_tokens=True)  # builds and caches the byte table
    tok.add_special_tokens({"additional_special_tokens": ["<|later|>"]})
    ids = tok.encode("a<|later|>b", add_special_tokens=False)
    for skip in (False, True):
        assert fast_decoder(tok, skip_special_tokens=skip)(ids) == tok.decode(
            ids, skip_special_tokens=skip
        )
