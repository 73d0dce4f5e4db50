"""BERT tokenizers without their normalizer, for texts it would only lowercase.

BERT-family tokenizers (WordPiece behind `BertNormalizer`: MiniLM, BGE, E5, GTE...) spend
about half their time in that normalizer. On printable ASCII plus tab and newlines it only
lowercases: the characters it removes or rewrites (controls, accents, CJK) are not there,
and the whitespace it maps to spaces splits words the same either way. Such texts are
lowercased by Python's `str.lower` (uncased models) and go to a twin tokenizer without a
normalizer: the same ids at 1.9x the rate on one core. Any other text takes the model's own
tokenizer, as does a text holding an added token that is matched before normalizing
(`[CLS]`, `[MASK]`): lowercasing it first would hide it from the matcher.
"""

from __future__ import annotations

import re

from tokenizers import Tokenizer, normalizers

_NOT_PLAIN = re.compile(r"[^\t\n\r\x20-\x7e]")  # what BertNormalizer does more than lowercase to

Item = str | tuple[str, str]  # a text, or a (text, pair) input


class PlainTwin:
    """The twin tokenizer, and which texts it takes (as `form` gives them)."""

    def __init__(self, backend: Tokenizer, lower: bool, unnormalized_added: list[str]) -> None:
        self.backend, self.lower = backend, lower
        # Lowercase forms, so that a token made by lowercasing shows as well as one hidden by it.
        self.guarded = [t.lower() for t in unnormalized_added] if lower else []

    @classmethod
    def of(cls, model: Tokenizer) -> PlainTwin | None:
        """The twin of a configured tokenizer (it keeps the truncation), or None: its
        normalizer is not `BertNormalizer`, or an added token matched after normalizing
        holds whitespace (there BertNormalizer's mapping of tabs and newlines to spaces counts)."""
        added = model.get_added_tokens_decoder().values()
        if not isinstance(model.normalizer, normalizers.BertNormalizer) or any(
                t.normalized and any(c.isspace() for c in t.content) for t in added):
            return None
        backend = Tokenizer.from_str(model.to_str())
        backend.normalizer = None
        return cls(backend, model.normalizer.lowercase, [t.content for t in added if not t.normalized])

    def form(self, item: Item) -> Item | None:
        """`item` as the twin takes it; None where only the model's normalizer is exact."""
        if isinstance(item, str):
            return self._text(item)
        text, pair = (self._text(t) for t in item)
        return None if text is None or pair is None else (text, pair)

    def _text(self, text: str) -> str | None:
        # `isprintable` is the fast C check for most texts; tabs and newlines need the regex.
        if not (isinstance(text, str) and text.isascii() and (text.isprintable() or not _NOT_PLAIN.search(text))):
            return None
        if self.lower:
            text = text.lower()
            if any(t in text for t in self.guarded):
                return None
        return text
