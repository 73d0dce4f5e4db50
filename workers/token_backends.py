"""Fast tokenizer backends for single texts, each checked against HF `tokenizers`.

A backend turns texts into their content ids (no special tokens, no truncation) as one
flat array plus row offsets; `wrap` adds the model's special tokens and truncates, as HF's
post-processor and truncation do. `nanotoken` serves WordPiece models, `gigatoken`
byte-level BPE and SentencePiece BPE; HF `tokenizers` serves everything (it is also the
reference the others are checked against: `workers.tokenizer_choice`). A backend that
cannot be imported or cannot load the model's tokenizer raises `BackendUnavailable`.

`bounded` hands each text to a backend cut to a prefix, so a long text is not tokenized
in full to keep `max_length` tokens.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from workers.encoded import Encoded, gather_index

CHARS_PER_TOKEN_BOUND = 16  # a first cut of 16 x max_length characters; doubled for rows it leaves short

Content = tuple[np.ndarray, np.ndarray]  # (T,) ids, (N+1,) int64 offsets


class BackendUnavailable(RuntimeError):
    """This backend cannot serve this tokenizer here (not installed, or unsupported)."""


class HFContent:
    """Content ids from HF `tokenizers` (the reference's own model, no post-processor)."""

    name = "tokenizers"

    def __init__(self, backend_json: str) -> None:
        self.backend = Tokenizer.from_str(backend_json)
        self.backend.no_truncation()
        self.backend.no_padding()

    def __call__(self, texts: list[str]) -> Content:
        encodings = self.backend.encode_batch_fast(texts, add_special_tokens=False)
        offsets = np.zeros(len(encodings) + 1, np.int64)
        np.cumsum(np.fromiter((len(e) for e in encodings), np.int64, len(encodings)), out=offsets[1:])
        ids = np.fromiter((i for e in encodings for i in e.ids), np.int32, int(offsets[-1]))
        return ids, offsets


def _load_fast(backend_json: str, package: str, model_type: str, load: Callable) -> object:
    """`load(package module)`, for a tokenizer whose model is `model_type`; else `BackendUnavailable`."""
    if json.loads(backend_json)["model"]["type"] != model_type:
        raise BackendUnavailable(f"{package} serves {model_type} models only")
    try:
        module = importlib.import_module(package)
    except ImportError as e:
        raise BackendUnavailable(f"{package} cannot be imported: {e}") from e
    try:
        return load(module)
    except Exception as e:
        raise BackendUnavailable(f"{package} cannot load this tokenizer: {e}") from e


class NanoContent:
    """Content ids from `nanotoken` (WordPiece models)."""

    name = "nanotoken"

    def __init__(self, backend_json: str) -> None:
        self.backend = _load_fast(backend_json, self.name, "WordPiece", lambda m: m.Tokenizer.from_json(backend_json))

    def __call__(self, texts: list[str]) -> Content:
        ragged = self.backend.encode_batch(texts, add_special_tokens=False)  # releases the GIL
        return ragged.ids, ragged.offsets


class GigaContent:
    """Content ids from `gigatoken` (byte-level BPE, SentencePiece BPE)."""

    name = "gigatoken"

    def __init__(self, backend_json: str) -> None:
        self.backend = _load_fast(backend_json, self.name, "BPE", lambda m: m.Tokenizer.from_json(backend_json).backend)

    def __call__(self, texts: list[str]) -> Content:
        layout = self.backend.encode_batch(texts).layout  # awkward: offsets + flat ids; releases the GIL
        offsets = np.asarray(layout.offsets, np.int64)
        ids = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
        return ids, offsets - offsets[0]


CONTENT_BACKENDS: dict[str, Callable[[str], Callable[[list[str]], Content]]] = {
    "nanotoken": NanoContent, "gigatoken": GigaContent, "tokenizers": HFContent,
}


def special_tokens(backend_json: str) -> tuple[np.ndarray, np.ndarray]:
    """(prefix, suffix): the ids the post-processor puts around a single text's content."""
    model = Tokenizer.from_str(backend_json)
    model.no_truncation()
    model.no_padding()
    bare, full = model.encode("a", add_special_tokens=False).ids, model.encode("a").ids
    start = next((i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare), None)
    if start is None:
        raise BackendUnavailable("the post-processor rewrites a text's content, not only surrounds it")
    return np.asarray(full[:start], np.int32), np.asarray(full[start + len(bare):], np.int32)


@dataclass
class Wrapped:
    """Content ids -> sequences as HF encodes them with truncation to `max_length`."""

    prefix: np.ndarray  # (P,) int32
    suffix: np.ndarray  # (S,) int32
    max_length: int

    def __post_init__(self) -> None:
        self.cap = self.max_length - len(self.prefix) - len(self.suffix)  # content tokens kept
        if self.cap <= 0:
            raise ValueError(f"max_length={self.max_length} leaves no room beside the special tokens")

    def __call__(self, content: Content) -> Encoded:
        ids, offsets = content
        lengths = np.diff(offsets)  # (N,)
        kept = np.minimum(lengths, self.cap)  # (N,)
        n, p, s = len(lengths), len(self.prefix), len(self.suffix)
        out_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(kept + p + s, out=out_offsets[1:])
        out = np.empty(int(out_offsets[-1]), np.int32)
        out[gather_index(out_offsets[:-1] + p, kept)] = ids[gather_index(offsets[:-1], kept)]
        for j in range(p):
            out[out_offsets[:-1] + j] = self.prefix[j]
        for j in range(s):
            out[out_offsets[1:] - s + j] = self.suffix[j]
        return Encoded(out, out_offsets, None, lengths > self.cap, np.arange(n, dtype=np.int64), np.zeros(n, np.int32))


def cut(text: str, bound: int) -> str:
    """`text` up to the first space at or after `bound` characters that ends a word (the
    tokens before such a space are those of the whole text), or whole."""
    at = text.find(" ", bound)
    while at > 0 and text[at - 1].isspace():
        at = text.find(" ", at + 1)
    return text if at < 0 else text[:at]


def cut_is_exact(backend_json: str, texts: list[str], bounds: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384)) -> str | None:
    """Why cutting texts (`cut`) can change the tokens before the cut with this
    tokenizer (a text whose cut's tokens are not the first ones of the whole), or None:
    checked with HF `tokenizers` at several cut points of each text."""
    content = HFContent(backend_json)
    for text in texts:
        forms = list(dict.fromkeys(f for b in bounds if len(f := cut(text, b)) < len(text)))
        if not forms:
            continue
        ids, offsets = content([text, *forms])
        whole = ids[: offsets[1]]
        for i, form in enumerate(forms, start=1):
            part = ids[offsets[i] : offsets[i + 1]]
            if not np.array_equal(part, whole[: len(part)]):
                return f"tokens before a cut depend on the text after it ({form[-40:]!r})"
    return None


def bounded(encode: Callable[[list[str]], Encoded], texts: list[str], max_length: int) -> Encoded:
    """`encode(texts)` (truncating, flagging truncated rows), each text cut to a prefix of
    `CHARS_PER_TOKEN_BOUND` x `max_length` characters; a cut row not left truncated (the
    prefix holds too few tokens to tell) is cut again at four times the bound, up to whole.
    The ids equal those of the whole texts truncated, where the backend's tokens before
    a word-ending space do not depend on what follows it (checked at load)."""
    bounds = np.full(len(texts), CHARS_PER_TOKEN_BOUND * max_length, np.int64)
    while True:
        forms = [t if len(t) <= b else cut(t, int(b)) for t, b in zip(texts, bounds)]
        enc = encode(forms)
        short = [i for i, (t, f) in enumerate(zip(texts, forms)) if len(f) < len(t) and not enc.truncated[i]]
        if not short:
            return enc
        bounds[short] *= 4
