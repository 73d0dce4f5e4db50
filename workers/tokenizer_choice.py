"""Which backend tokenizes a job's single texts: the fastest one that gives HF
`tokenizers`' ids, checked, never assumed.

At load, each candidate (nanotoken for WordPiece or gigatoken for BPE, then HF
`tokenizers`; each first with texts cut to a bounded prefix, then whole) is compared with the reference (HF `tokenizers`, whole texts,
its own truncation) on `hard_cases()`; the first that agrees on every row is chosen. The
chosen backend is compared again on the job's first rows (`check_rows`); a mismatch there
falls back to the reference for the rest of the job. Each fallback's reason is logged and
recorded in the shards' provenance (`tokenizer`, `tokenizer_fallback`).

The outcome of the check on `hard_cases()` depends only on the tokenizer, the cases, the
checking code and the backends' builds, so it is kept across processes under
`cache_root()/tokenizer-checks`, keyed by all of them (a backend that cannot be imported
is part of the key); every process still checks its job's first rows.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from states.files import cache_root, store_cached
from workers.encoded import Encoded
from workers.token_backends import BackendUnavailable, cut_is_exact
from workers.tokenize import REFERENCE, BatchTokenizer, TokenizerSpec

log = logging.getLogger(__name__)

FAST_BACKEND = {"WordPiece": "nanotoken", "BPE": "gigatoken"}  # tokenizer.json model type -> fast backend
SAMPLE_ROWS = 256  # the job's first rows checked against the reference


def hard_cases() -> list[str]:
    """Texts where tokenizers disagree if any do: accents and normalization forms, CJK,
    emoji and joiners, control and zero-width characters, right-to-left text, special
    tokens typed into text, very long words and numbers, whitespace runs, texts cut by
    the bounded prefix at every kind of boundary, and a 1 MB text."""
    rng = np.random.default_rng(19)
    pieces = ["Café crème brûlée", "naïve Zoë", "e\u0301", "Ａｂｃ ﬁne", "中文分词测试，标点。", "日本語のテキスト", "한국어 문장",
              "emoji 😀👍🏽 👨‍👩‍👧 🇫🇷", "zero\u200bwidth\u200d\ufeff", "ctrl\x00\x07\x0b\x7f\x1b[0m", "tab\tnew\nline\r\n",
              "nbsp\u00a0thin\u2009", "שלום עולם", "مرحبا بالعالم", "\u202eRTL override\u202c", "[CLS] [SEP] [MASK] [PAD] [UNK]",
              "<s> </s> <pad> <unk> <|endoftext|> <|im_start|>user<|im_end|>", "don't it's we'll I'M", "3.14159 1,234,567 0x1F",
              "x" * 150, "é" * 120, "ab" * 400, "https://example.com/a_b?c=d&e=f#g", "def f(x):\n    return x ** 2\n",
              "    indented   spaces    ", "ÀÉÎÕÜ ÆØÅ ß ŒŒ", "\ufffd\ud7ff", "Ελληνικά Кириллица", "ｶﾀｶﾅ ㈱ ①②", "ABC DEF Ghi"]
    cases = list(pieces) + ["", " ", "  \n ", "a"]
    for n in (2, 5, 40, 400, 3000):  # mixtures of every piece, past truncation and past the bounded prefix
        for _ in range(4 if n < 3000 else 1):
            cases.append(" ".join(pieces[i] for i in rng.integers(0, len(pieces), n)))
    cases.append("".join(pieces[i] for i in rng.integers(0, len(pieces), 200)))  # no spaces between pieces
    cases.append("word " * 3000 + "[SEP] tail")
    cases.append(" ".join(pieces[i] for i in rng.integers(0, len(pieces), 40_000))[: 1 << 20])  # 1 MB
    return cases


def first_mismatch(got: Encoded, want: Encoded) -> int | None:
    """The first row whose ids or truncation flag differ, or None."""
    for row in range(len(want.offsets) - 1):
        if (row >= len(got.offsets) - 1 or got.truncated[row] != want.truncated[row]
                or not np.array_equal(got.sequence(row), want.sequence(row))):
            return row
    return None if len(got.offsets) == len(want.offsets) else len(want.offsets) - 1


def compare(candidate: BatchTokenizer, texts: list[str], want: Encoded) -> str | None:
    """Why `candidate` is not exact on `texts` (the first row differing from the
    reference's encoding `want`), or None."""
    try:
        row = first_mismatch(candidate(texts), want)
    except Exception as e:  # a backend that raises where the reference does not is not exact
        return f"{candidate.backend} failed: {type(e).__name__}: {e}"
    if row is None:
        return None
    form = "bounded prefix" if candidate.bounded else "whole texts"
    return f"{candidate.backend} ({form}) differs from HF tokenizers on {texts[row][:60]!r}{'...' if len(texts[row]) > 60 else ''}"


@dataclass
class TokenizerChoice:
    """The spec workers tokenize with, and why a faster backend was not taken."""

    spec: TokenizerSpec
    fallback: str = ""  # reasons, "; "-joined

    def provenance(self) -> dict[str, str]:
        return {"tokenizer": self.spec.backend, "tokenizer_bounded": str(self.spec.bounded),
                "tokenizer_fallback": self.fallback}

    def check_rows(self, texts: list[str]) -> bool:
        """Compare the chosen backend with the reference on the job's first rows (usable
        texts); on a mismatch fall back to the reference. Whether the spec changed."""
        if self.spec.backend == REFERENCE or not texts:
            return False
        sample = texts[:SAMPLE_ROWS]
        why = compare(self.spec.build(), sample, replace(self.spec, backend=REFERENCE).build()(sample))
        if why is None:
            return False
        self._fall_back(f"job rows: {why}", REFERENCE)
        return True

    def _fall_back(self, why: str, backend: str) -> None:
        log.warning("tokenizer %s not used: %s; using %s", self.spec.backend, why, backend)
        self.fallback = f"{self.fallback}; {why}" if self.fallback else why
        self.spec = replace(self.spec, backend=backend)


def choose_tokenizer(hf_tokenizer, max_length: int, prompt: str = "", chunk: bool = False, stride: int = 0,
                     pairs: bool = False) -> TokenizerChoice:
    """The fastest backend exact on `hard_cases()` for single texts; the reference for
    chunking and for pairs (no fast backend takes pairs). Checked once per process and
    tokenizer (`choose_backend`'s cache)."""
    spec = TokenizerSpec.from_hf(hf_tokenizer, max_length, prompt, chunk, stride)
    if chunk or pairs:
        return TokenizerChoice(spec)
    return TokenizerChoice(*choose_backend(spec))


@functools.lru_cache(maxsize=8)
def choose_backend(spec: TokenizerSpec) -> tuple[TokenizerSpec, str]:
    """(`spec` with the fastest backend exact on `hard_cases()`, why faster ones were not
    taken): from the cross-process cache, else checked (`check_backends`) and stored."""
    entry = cache_root() / "tokenizer-checks" / f"{_check_key(spec)}.json"
    try:
        stored = json.loads(entry.read_text())
        return replace(spec, backend=stored["backend"], bounded=stored["bounded"]), stored["fallback"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    candidate, fallback = check_backends(spec)
    store_cached(entry, {"backend": candidate.backend, "bounded": candidate.bounded, "fallback": fallback})
    return candidate, fallback


BACKEND_MODULES = ("tokenizers", "nanotoken", "gigatoken")
_CHECK_CODE = ("tokenizer_choice.py", "token_backends.py", "tokenize.py")  # the cases, the backends' wrappers


def _check_key(spec: TokenizerSpec) -> str:
    """What the check's outcome depends on: the spec, this package's checking code, and
    each backend's build (its version and file, or that it cannot be imported)."""
    digest = hashlib.sha256(spec.key.encode())
    for name in _CHECK_CODE:
        digest.update((Path(__file__).parent / name).read_bytes())
    for name in BACKEND_MODULES:
        try:
            module = importlib.import_module(name)
            build = f"{getattr(module, '__version__', '?')}:{getattr(module, '__file__', '?')}"
        except ImportError:
            build = "unavailable"
        digest.update(f"\0{name}={build}".encode())
    return digest.hexdigest()[:32]


def check_backends(spec: TokenizerSpec) -> tuple[TokenizerSpec, str]:
    """Compare each candidate, fastest first, with the reference on `hard_cases()`."""
    kind = json.loads(spec.backend_json)["model"]["type"]
    fast = FAST_BACKEND.get(kind)
    candidates = ([(fast, True), (fast, False)] if fast else []) + [("tokenizers", True)]  # fastest first
    cases = hard_cases()
    want = spec.build()(cases)
    not_local = cut_is_exact(spec.backend_json, [c for c in cases if len(c) < 100_000])
    reasons = [f"bounded prefix: {not_local}"] if not_local else []
    for backend, bounded in candidates:
        if bounded and not_local:
            continue
        try:
            candidate = replace(spec, backend=backend, bounded=bounded)
            why = compare(candidate.build(), cases, want)
        except (BackendUnavailable, ValueError) as e:
            why = f"{backend}: {e}"
        if why is None:
            break
        reasons.append(why)
    else:
        candidate = spec
    fallback = "; ".join(dict.fromkeys(reasons))
    if fallback:
        log.warning("tokenizer fallback: %s; using %s", fallback, candidate.backend)
    return candidate, fallback
