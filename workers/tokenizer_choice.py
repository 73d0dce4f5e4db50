"""Which backend tokenizes a job's texts or text pairs: the fastest one that gives HF
`tokenizers`' ids, checked, never assumed.

At load, each candidate (nanotoken for WordPiece or gigatoken for BPE, then HF
`tokenizers`; for single texts each first with texts cut to a bounded prefix, then whole)
is compared with the reference (HF `tokenizers`, whole texts, its own truncation) on
`hard_cases()` (for a pair job, each case paired with the next); the first that agrees on
every row, ids, token types and truncation flags, is chosen. The
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
from tokenizers import Tokenizer

from states.files import cache_root, store_cached
from workers.encoded import Encoded
from workers.token_backends import BackendUnavailable, HFContent, cut_is_exact, longest_first
from workers.tokenize import REFERENCE, BatchTokenizer, TokenizerSpec

log = logging.getLogger(__name__)

FAST_BACKEND = {"WordPiece": "nanotoken", "BPE": "gigatoken"}  # tokenizer.json model type -> fast backend
SAMPLE_ROWS = 256  # the job's first rows checked against the reference
MAX_PAIR_WINDOWS = 64  # overflowing-window combinations the reference may build for one checked pair


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
    """The first row whose ids, token types or truncation flag differ, or None."""
    if (got.type_ids is None) != (want.type_ids is None):
        return 0
    for row in range(len(want.offsets) - 1):
        if (row >= len(got.offsets) - 1 or got.truncated[row] != want.truncated[row]
                or not np.array_equal(got.sequence(row), want.sequence(row))):
            return row
    if want.type_ids is not None and not np.array_equal(got.type_ids, want.type_ids):
        bad = int(np.argmax(got.type_ids != want.type_ids)) if len(got.type_ids) == len(want.type_ids) else 0
        return int(np.searchsorted(want.offsets, bad, side="right") - 1)
    return None if len(got.offsets) == len(want.offsets) else len(want.offsets) - 1


def pair_cases(texts: list[str]) -> list[str]:
    """The second texts `hard_cases()` are checked with in a pair job: each case's next."""
    return texts[1:] + texts[:1]


def checkable(spec: TokenizerSpec, texts: list[str], pairs: list[str] | None) -> tuple[list[str], list[str] | None]:
    """The texts (and pairs) the reference can encode in bounded memory: all single texts;
    the pairs whose two sides' overflowing windows combine into at most `MAX_PAIR_WINDOWS`
    encodings, which HF `tokenizers` builds for every truncated pair (a 1 MB text paired
    with a long one would take gigabytes)."""
    if pairs is None:
        return texts, None
    content = HFContent(spec.backend_json)
    n1, n2 = (np.diff(content([spec.prompt + t for t in texts])[1]), np.diff(content(pairs)[1]))
    budget = spec.max_length - Tokenizer.from_str(spec.backend_json).num_special_tokens_to_add(True)
    k1, k2 = longest_first(n1, n2, budget)
    windows = -(-n1 // np.maximum(k1, 1)) * -(-n2 // np.maximum(k2, 1))
    keep = np.flatnonzero(windows <= MAX_PAIR_WINDOWS)
    return [texts[i] for i in keep], [pairs[i] for i in keep]


def compare(candidate: BatchTokenizer, texts: list[str], want: Encoded, pairs: list[str] | None = None) -> str | None:
    """Why `candidate` is not exact on `texts` (with `pairs`: on those pairs), the first row
    differing from the reference's encoding `want`, or None."""
    try:
        row = first_mismatch(candidate(texts, pairs), want)
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

    def check_rows(self, texts: list[str], pairs: list[str] | None = None) -> bool:
        """Compare the chosen backend with the reference on the job's first rows (usable
        texts, and their pairs); on a mismatch fall back to the reference. Whether the spec changed."""
        if self.spec.backend == REFERENCE or not texts:
            return False
        sample, second = checkable(self.spec, texts[:SAMPLE_ROWS], None if pairs is None else pairs[:SAMPLE_ROWS])
        reference = replace(self.spec, backend=REFERENCE).build()
        why = compare(self.spec.build(), sample, reference(sample, second), second)
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
    """The fastest backend exact on `hard_cases()` for single texts or text pairs; the
    reference for chunking. Checked once per process and tokenizer (`choose_backend`'s cache)."""
    spec = TokenizerSpec.from_hf(hf_tokenizer, max_length, prompt, chunk, stride, pairs)
    if chunk:
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
    """Compare each candidate, fastest first, with the reference on `hard_cases()` (pairs
    of them for a pair spec, which are never cut to a bounded prefix)."""
    kind = json.loads(spec.backend_json)["model"]["type"]
    fast = FAST_BACKEND.get(kind)
    candidates = ([(fast, True), (fast, False)] if fast else []) + [("tokenizers", True)]  # fastest first
    if spec.pairs:
        candidates = list(dict.fromkeys((backend, False) for backend, _ in candidates))
    cases, second = checkable(spec, hard_cases(), pair_cases(hard_cases()) if spec.pairs else None)
    want = spec.build()(cases, second)
    not_local = None if spec.pairs else cut_is_exact(spec.backend_json, [c for c in cases if len(c) < 100_000])
    reasons = [f"bounded prefix: {not_local}"] if not_local else []
    for backend, bounded in candidates:
        if bounded and not_local:
            continue
        try:
            candidate = replace(spec, backend=backend, bounded=bounded)
            why = compare(candidate.build(), cases, want, second)
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
