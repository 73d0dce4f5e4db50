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


@dataclass
class PairTemplate:
    """Where the post-processor puts special tokens around a pair's two contents, and the
    token type of each part: prefix, first content, middle, second content, suffix."""

    parts: tuple[np.ndarray, np.ndarray, np.ndarray]  # (prefix, middle, suffix) ids, int32
    types: tuple[int, int, int, int, int]  # prefix, first, middle, second, suffix

    @classmethod
    def of(cls, backend_json: str) -> PairTemplate:
        """Read from HF `tokenizers` encoding a pair; `BackendUnavailable` where the
        post-processor does more than put fixed tokens of one type per part around them."""
        model = Tokenizer.from_str(backend_json)
        model.no_truncation()
        model.no_padding()
        a, b = model.encode("a", add_special_tokens=False).ids, model.encode("b", add_special_tokens=False).ids
        # As the reference encodes: where there is no post-processor, `encode` gives the
        # second text type 1 and `encode_batch_fast` type 0.
        full = model.encode_batch_fast([("a", "b")])[0]
        ids, types = full.ids, full.type_ids
        i = next((k for k in range(len(ids) - len(a) + 1) if ids[k : k + len(a)] == a), None)
        j = None if i is None else next((k for k in range(len(ids) - len(b), i + len(a) - 1, -1)
                                         if ids[k : k + len(b)] == b), None)
        if j is None:
            raise BackendUnavailable("the post-processor rewrites a pair's contents, not only surrounds them")
        spans = [(0, i), (i, i + len(a)), (i + len(a), j), (j, j + len(b)), (j + len(b), len(ids))]
        kinds = [set(types[x:y]) for x, y in spans]
        if any(len(k) > 1 for k in kinds) or not kinds[1] or not kinds[3]:
            raise BackendUnavailable("the post-processor gives one part of a pair several token types")
        template = cls(tuple(np.asarray(ids[x:y], np.int32) for x, y in spans[0::2]),
                       tuple(next(iter(k), 0) for k in kinds))
        first, second = "a b, a", "b a."  # the template must reproduce another pair
        contents = [model.encode(t, add_special_tokens=False).ids for t in (first, second)]
        got = template.encode(*((np.asarray(c, np.int32), np.asarray([0, len(c)], np.int64)) for c in contents), 1 << 30)
        want = model.encode_batch_fast([(first, second)])[0]
        if got.ids.tolist() != want.ids or got.type_ids.tolist() != want.type_ids:
            raise BackendUnavailable("the post-processor does not put the same tokens around every pair")
        return template

    def encode(self, first: Content, second: Content, max_length: int) -> Encoded:
        """Both contents of each pair, truncated as HF's `longest_first` does to fit
        `max_length` with the special tokens, in the template; token types per part."""
        (ids_a, off_a), (ids_b, off_b) = first, second
        len_a, len_b = np.diff(off_a), np.diff(off_b)  # (N,)
        keep_a, keep_b = longest_first(len_a, len_b, max_length - sum(len(p) for p in self.parts))
        prefix, middle, suffix = self.parts
        pieces = [(prefix, None), (ids_a, (off_a, keep_a)), (middle, None), (ids_b, (off_b, keep_b)), (suffix, None)]
        n = len(len_a)
        widths = [np.full(n, len(v), np.int64) if at is None else at[1] for v, at in pieces]  # 5 x (N,)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(sum(widths), out=offsets[1:])
        out = np.empty(int(offsets[-1]), np.int32)
        types = np.empty(int(offsets[-1]), np.int32)
        start = offsets[:-1].copy()  # (N,) where the next part of each row goes
        for (values, at), width, kind in zip(pieces, widths, self.types):
            where = gather_index(start, width)
            out[where] = np.tile(values, n) if at is None else values[gather_index(at[0][:-1], width)]
            types[where] = kind
            start += width
        truncated = (keep_a < len_a) | (keep_b < len_b)
        return Encoded(out, offsets, types, truncated, np.arange(n, dtype=np.int64), np.zeros(n, np.int32))


def longest_first(n1: np.ndarray, n2: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens kept of each side of each pair: HF `tokenizers`' `longest_first` truncation
    (tokenizers/src/utils/truncation.rs): nothing when both fit; else the shorter side whole
    and the longer cut to the rest, unless the shorter alone passes half the budget, when
    the shorter keeps budget // 2 and the longer the remainder."""
    short = np.minimum(n1, n2)
    keep_long = np.where(short > budget, short, np.maximum(short, budget - short))
    keep_short = short.copy()
    both = short + keep_long > budget
    keep_short[both], keep_long[both] = budget // 2, budget // 2 + budget % 2
    swapped = n1 > n2
    k1, k2 = np.where(swapped, keep_long, keep_short), np.where(swapped, keep_short, keep_long)
    fits = n1 + n2 <= budget
    return np.where(fits, n1, np.minimum(n1, k1)), np.where(fits, n2, np.minimum(n2, k2))


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
