"""The plain-text twin of BERT tokenizers (`workers.plain_text`) gives the model's own
tokenizer's ids, row for row."""

from __future__ import annotations

import json
import string

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.conftest import minilm_dir
from workers.tokenize import BatchTokenizer


def _minilm_json(**normalizer) -> str:
    config = json.loads((minilm_dir() / "tokenizer.json").read_text())
    config["normalizer"].update(normalizer)
    return json.dumps(config)


def _random_ascii(rng: np.random.Generator, n: int) -> list[str]:
    """Printable ASCII with tabs and newlines: mixed case, punctuation, special-token
    look-alikes, words past WordPiece's 100-character limit, texts past truncation."""
    alphabet = np.array(list(string.ascii_letters + string.digits + string.punctuation + " \t\n\r" + " " * 20))
    pieces = ["[CLS]", "[MASK]", "[sep]", "Hello", "WORLD", "x" * 120, "don't", "e-mail", "3.14"]
    texts = []
    for _ in range(n):
        chars = alphabet[rng.integers(0, len(alphabet), rng.integers(0, 400))].tolist()
        for _ in range(rng.integers(0, 4)):
            chars.insert(int(rng.integers(0, len(chars) + 1)), f" {pieces[rng.integers(0, len(pieces))]} ")
        texts.append("".join(chars))
    return texts + ["", " ", "\t\n\r", "A" * 5000]


# Texts BertNormalizer changes beyond lowercasing: each must go to the model's own tokenizer.
NOT_PLAIN = ["Café crème", "naïve", "a\x00b", "tab\x0bvertical", "bell\x07", "del\x7fete", "中文 text", "ﬁne", "Ｆｕｌｌ",
             "zero\u200bwidth", "nbsp\u00a0space", "\ufffd"]
# Plain, but holding an added token matched before normalizing, once lowercased: uncased
# models send them to their own tokenizer too ("[MASK]" lowercased first would be words).
GUARDED = ["say [MASK] here", "[cls] lowercased special"]
SPECIALS = ("[pad]", "[unk]", "[cls]", "[sep]", "[mask]")  # MiniLM's added tokens, lowercased


class _Counting:
    """Counts the texts a backend tokenizes."""

    def __init__(self, backend: Tokenizer) -> None:
        self.backend, self.texts = backend, 0

    def encode_batch_fast(self, inputs, **kwargs):
        self.texts += len(inputs)
        return self.backend.encode_batch_fast(inputs, **kwargs)


def _reference(backend_json: str, max_length: int, chunk: bool = False) -> BatchTokenizer:
    tokenize = BatchTokenizer(backend_json, max_length, True, chunk=chunk, stride=8 if chunk else 0)
    tokenize.plain = None  # the model's own normalizer for every text
    return tokenize


def _assert_same(got, want) -> None:
    for name in ("ids", "offsets", "truncated", "source", "chunk", "type_ids"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), name


@pytest.mark.parametrize("chunk", [False, True])
@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
def test_plain_twin_gives_the_models_ids(lowercase, chunk):
    backend_json = _minilm_json(lowercase=lowercase)
    texts = _random_ascii(np.random.default_rng(0), 400)
    mixed = texts[:50] + NOT_PLAIN + GUARDED + texts[50:]  # rows of every kind, in one batch
    tokenize = BatchTokenizer(backend_json, 128, True, chunk=chunk, stride=8 if chunk else 0)
    tokenize.plain.backend = plain = _Counting(tokenize.plain.backend)
    tokenize.backend = own = _Counting(tokenize.backend)
    reference = _reference(backend_json, 128, chunk)
    _assert_same(tokenize(mixed), reference(mixed))
    guarded = GUARDED + [t for t in texts if any(x in t.lower() for x in SPECIALS)] if lowercase else []
    assert own.texts == len(NOT_PLAIN) + len(guarded) and plain.texts == len(mixed) - own.texts
    pairs = mixed[::-1]
    _assert_same(tokenize(mixed, pairs), reference(mixed, pairs))


def test_each_non_plain_text_goes_to_the_models_normalizer():
    """One at a time, so a misrouted text shows by name (most differ under the twin)."""
    tokenize, reference = BatchTokenizer(_minilm_json(), 512, False), _reference(_minilm_json(), 512)
    tokenize.plain.backend = plain = _Counting(tokenize.plain.backend)
    for text in NOT_PLAIN + GUARDED:
        _assert_same(tokenize([text]), reference([text]))
    assert plain.texts == 0


def test_twin_only_where_it_is_exact():
    assert BatchTokenizer(_minilm_json(), 512, False).plain is not None
    config = json.loads(_minilm_json())
    config["added_tokens"].append({**config["added_tokens"][0], "id": 30522, "content": "new line", "normalized": True})
    assert BatchTokenizer(json.dumps(config), 512, False).plain is None  # "new\nline" would match it
    config = json.loads(_minilm_json())
    config["normalizer"] = {"type": "Lowercase"}
    assert BatchTokenizer(json.dumps(config), 512, False).plain is None
