"""Every tokenizer backend gives HF `tokenizers`' ids, row for row, and a backend that
does not is caught (at load, or on the job's first rows) and replaced by the reference."""

from __future__ import annotations

import functools
import json
import sys

import numpy as np
import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tests.conftest import minilm_dir
from workers import token_backends
from workers.tokenize import REFERENCE, BatchTokenizer, TokenizerSpec
from workers.tokenizer_choice import choose_backend, choose_tokenizer, first_mismatch, hard_cases

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
ALPHABET = ("abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|"
            "\t\n\r éèêëàâäôöûüçñßæøå ÉÀÇÑ 中文日本語한국어 😀👍🏽🇫🇷 \u200b\u200d\u00a0\u202e שלום مرحبا Ελλάδα Москва ﬁ①")


def corpus(n: int, seed: int) -> list[str]:
    """Random texts over many scripts and symbols, with words past WordPiece's limits,
    special tokens typed in, and texts past truncation and past the bounded prefix."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list(ALPHABET))
    pieces = ["[CLS]", "[MASK]", "[sep]", "<|endoftext|>", "<|im_start|>", "[NEW]", "x" * 130, "don't", "3.14", "e-mail"]
    texts = []
    for _ in range(n):
        length = int(rng.choice([rng.integers(0, 60), rng.integers(0, 800), rng.integers(0, 12_000)], p=[0.5, 0.4, 0.1]))
        chars = alphabet[rng.integers(0, len(alphabet), length)].tolist()
        for _ in range(rng.integers(0, 4)):
            chars.insert(int(rng.integers(0, len(chars) + 1)), f" {pieces[rng.integers(0, len(pieces))]} ")
        texts.append("".join(chars))
    return texts + ["", " ", "\t\n\r", "A" * 5000, "word " * 5000]


@functools.lru_cache(maxsize=None)
def training_texts() -> list[str]:
    return corpus(200, seed=1) + hard_cases()[:40]


@functools.lru_cache(maxsize=None)
def wordpiece(lowercase: bool) -> str:
    config = json.loads((minilm_dir() / "tokenizer.json").read_text())
    config["normalizer"]["lowercase"] = lowercase
    tok = Tokenizer.from_str(json.dumps(config))
    tok.add_special_tokens([AddedToken("[NEW]", special=True)])
    return tok.to_str()


@functools.lru_cache(maxsize=None)
def byte_level_bpe() -> str:
    """Qwen2-style: its split regex, byte-level BPE, no normalizer, special tokens added."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(training_texts(), trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|endoftext|>"]))
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    return tok.to_str()


@functools.lru_cache(maxsize=None)
def sentencepiece_bpe() -> str:
    """Llama-style: Metaspace, BPE with byte fallback, a BOS post-processor."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.train_from_iterator(training_texts(), trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok.to_str()


@functools.lru_cache(maxsize=None)
def unigram() -> str:
    """SentencePiece Unigram (T5-style), CLS/SEP-free with an EOS suffix."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(training_texts(), trainers.UnigramTrainer(
        vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return tok.to_str()


CONFIGS = {"wordpiece-uncased": lambda: wordpiece(True), "wordpiece-cased": lambda: wordpiece(False),
           "bytelevel-bpe-qwen2": byte_level_bpe, "sentencepiece-bpe": sentencepiece_bpe, "unigram": unigram}
# The backend each config gets at load, and whether texts are cut to a bounded prefix
# (not where BPE merges across words: no pre-tokenizer splits them).
CHOSEN = {"wordpiece-uncased": ("nanotoken", True), "wordpiece-cased": ("nanotoken", True),
          "bytelevel-bpe-qwen2": ("gigatoken", True), "sentencepiece-bpe": ("gigatoken", False),
          "unigram": ("tokenizers", True)}


@pytest.fixture(autouse=True)
def _fresh_choice(tmp_path, monkeypatch):
    """Each test checks backends anew (the choice is cached per process and on disk)."""
    monkeypatch.setenv("POOLJOBS_CACHE", str(tmp_path / "cache"))
    choose_backend.cache_clear()
    yield
    choose_backend.cache_clear()


@pytest.fixture(scope="module", params=list(CONFIGS))
def config(request) -> tuple[str, str]:
    return request.param, CONFIGS[request.param]()


class _HF:
    """A transformers-like tokenizer around a `tokenizers` JSON, as `choose_tokenizer` takes it."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, backend_json: str) -> None:
        self.backend_tokenizer = Tokenizer.from_str(backend_json)


def _spec(backend_json: str, max_length: int, backend: str = REFERENCE, prompt: str = "") -> TokenizerSpec:
    return TokenizerSpec(backend_json, max_length, False, prompt, backend=backend)


def _spec(backend_json: str, max_length: int, backend: str = REFERENCE, prompt: str = "",
          bounded: bool = True) -> TokenizerSpec:
    return TokenizerSpec(backend_json, max_length, False, prompt, backend=backend, bounded=bounded)


@pytest.mark.parametrize("max_length", [16, 512])
def test_every_backend_gives_the_reference_ids(config, max_length):
    """Each fast backend on whole texts, and what load chooses, against the reference
    (the 1 MB hard case is left to the load-time checks and the cut test)."""
    name, backend_json = config
    texts = corpus(600, seed=max_length) + hard_cases()[:-1]
    want = _spec(backend_json, max_length).build()(texts)
    backend, bounded = CHOSEN[name]
    for form in {(backend, False), (backend, bounded), ("tokenizers", False)}:
        got = _spec(backend_json, max_length, *form[:1], bounded=form[1]).build()(texts)
        assert first_mismatch(got, want) is None, form
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.offsets, want.offsets), form
        assert np.array_equal(got.truncated, want.truncated) and got.truncated.any(), form


def test_load_picks_the_fast_backend_where_one_serves(config):
    name, backend_json = config
    choice = choose_tokenizer(_HF(backend_json), 128)
    assert (choice.spec.backend, choice.spec.bounded) == CHOSEN[name]
    assert choice.provenance()["tokenizer"] == CHOSEN[name][0]
    assert (choice.provenance()["tokenizer_fallback"] == "") == (name != "sentencepiece-bpe")
    if name == "sentencepiece-bpe":
        assert choice.fallback.startswith("bounded prefix: tokens before a cut depend on the text after it")


def test_prompt_pairs_and_chunks(config):
    name, backend_json = config
    texts = corpus(100, seed=5)
    want = _spec(backend_json, 64, prompt="query: ").build()(texts)
    backend, bounded = CHOSEN[name]
    assert first_mismatch(_spec(backend_json, 64, backend, "query: ", bounded).build()(texts), want) is None
    paired = choose_tokenizer(_HF(backend_json), 64, pairs=True).spec
    assert (paired.backend, paired.bounded, paired.pairs) == (backend, False, True)
    assert choose_tokenizer(_HF(backend_json), 64, chunk=True, stride=8).spec.backend == REFERENCE


def _pair_spec(backend_json: str, max_length: int, backend: str = REFERENCE, prompt: str = "") -> TokenizerSpec:
    return TokenizerSpec(backend_json, max_length, True, prompt, backend=backend, bounded=False, pairs=True)


@pytest.mark.parametrize("max_length", [32, 512])
def test_pairs_give_the_reference_ids_types_and_truncation(config, max_length):
    """Both sides of each pair truncated as `longest_first`, in the post-processor's
    template, with its token types: each backend against the reference (on texts of at
    most 1,500 characters: the reference builds every combination of both sides'
    overflowing windows)."""
    name, backend_json = config
    texts = [t[:1500] for t in corpus(400, seed=max_length) + hard_cases()]
    pairs = [t[:1500] for t in corpus(len(texts), seed=max_length + 1)][: len(texts)]
    want = _pair_spec(backend_json, max_length, prompt="q: ").build()(texts, pairs)
    for backend in {CHOSEN[name][0], "tokenizers"}:
        got = _pair_spec(backend_json, max_length, backend, "q: ").build()(texts, pairs)
        assert first_mismatch(got, want) is None, backend
        assert np.array_equal(got.type_ids, want.type_ids), backend
        assert got.truncated.any() and not got.truncated.all(), backend


def test_longest_first_is_hf_truncation_at_every_length():
    """Every split of a pair's lengths around odd and even budgets, ties included."""
    backend_json = CONFIGS["wordpiece-uncased"]()
    for max_length in (7, 8, 9):
        texts = [("a " * n1).strip() for n1 in range(13) for _ in range(13)]
        pairs = [("b " * n2).strip() for _ in range(13) for n2 in range(13)]
        want = _pair_spec(backend_json, max_length).build()(texts, pairs)
        got = _pair_spec(backend_json, max_length, "nanotoken").build()(texts, pairs)
        assert first_mismatch(got, want) is None and np.array_equal(got.type_ids, want.type_ids)


def test_a_broken_backend_is_caught_on_pairs(monkeypatch):
    backend_json = CONFIGS["wordpiece-uncased"]()
    _break(monkeypatch, token_backends.NanoContent, "Café")  # one of the hard cases
    choice = choose_tokenizer(_HF(backend_json), 128, pairs=True)
    assert choice.spec.backend == "tokenizers"
    assert choice.fallback.startswith("nanotoken (whole texts) differs from HF tokenizers on ")


def _break(monkeypatch, cls, marker: str) -> None:
    """`cls` returns one wrong id for every text holding `marker`."""
    call = cls.__call__

    def broken(self, texts):
        ids, offsets = call(self, texts)
        ids = np.array(ids)
        for i, text in enumerate(texts):
            if marker in text and offsets[i + 1] > offsets[i]:
                ids[offsets[i]] += 1
        return ids, offsets

    monkeypatch.setattr(cls, "__call__", broken)


@pytest.mark.parametrize("name,cls", [("wordpiece-uncased", token_backends.NanoContent),
                                      ("bytelevel-bpe-qwen2", token_backends.GigaContent)])
def test_a_broken_backend_is_caught_at_load(monkeypatch, name, cls):
    backend_json = CONFIGS[name]()
    _break(monkeypatch, cls, "Café")  # one of the hard cases
    choice = choose_tokenizer(_HF(backend_json), 128)
    assert choice.spec.backend == "tokenizers"
    assert choice.fallback.startswith(f"{cls.name} (bounded prefix) differs from HF tokenizers on ")


def test_a_backend_broken_on_the_jobs_rows_falls_back(monkeypatch):
    backend_json = CONFIGS["wordpiece-cased"]()
    _break(monkeypatch, token_backends.NanoContent, "pooljobs-marker")  # in no hard case
    choice = choose_tokenizer(_HF(backend_json), 128)
    assert choice.spec.backend == "nanotoken"
    assert not choice.check_rows(corpus(50, seed=2))
    assert choice.check_rows(corpus(50, seed=3) + ["a pooljobs-marker row"])
    assert choice.provenance()["tokenizer"] == REFERENCE
    assert "job rows: nanotoken (bounded prefix) differs" in choice.provenance()["tokenizer_fallback"]


def test_the_load_check_is_kept_across_processes_and_redone_when_a_backend_changes(monkeypatch):
    from workers import tokenizer_choice

    backend_json, check = CONFIGS["wordpiece-uncased"](), tokenizer_choice.check_backends
    first = choose_tokenizer(_HF(backend_json), 128)
    choose_backend.cache_clear()  # as a new process would start
    monkeypatch.setattr(tokenizer_choice, "check_backends", lambda spec: pytest.fail("checked again"))
    again = choose_tokenizer(_HF(backend_json), 128)
    assert (again.spec, again.fallback) == (first.spec, first.fallback) and again.spec.backend == "nanotoken"
    monkeypatch.setattr(tokenizer_choice, "check_backends", check)
    monkeypatch.setitem(sys.modules, "nanotoken", None)  # the backend's build changed: the key does
    choose_backend.cache_clear()
    assert choose_tokenizer(_HF(backend_json), 128).spec.backend == "tokenizers"


@pytest.mark.parametrize("module", ["nanotoken", "gigatoken"])
def test_jobs_run_on_hf_tokenizers_without_the_package(monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    name = "wordpiece-uncased" if module == "nanotoken" else "bytelevel-bpe-qwen2"
    backend_json = CONFIGS[name]()
    choice = choose_tokenizer(_HF(backend_json), 128)
    assert choice.spec.backend == "tokenizers" and f"{module} cannot be imported" in choice.fallback
    texts = corpus(100, seed=4)
    assert first_mismatch(choice.spec.build()(texts), _spec(backend_json, 128).build()(texts)) is None


@pytest.mark.parametrize("backend", ["nanotoken", "tokenizers"])
def test_a_long_text_is_cut_before_tokenizing(monkeypatch, backend):
    """A 1 MB text hands the backend a bounded prefix; the ids are those of the whole text
    truncated. A text whose first prefix holds too few tokens is cut again, longer."""
    backend_json = CONFIGS["wordpiece-uncased"]()
    handed: list[int] = []
    cls = token_backends.CONTENT_BACKENDS[backend]
    call = cls.__call__
    monkeypatch.setattr(cls, "__call__", lambda self, texts: handed.extend(map(len, texts)) or call(self, texts))
    rng = np.random.default_rng(0)
    words = ["alpha", "Beta", "café", "中文", "x" * 30, "3.14", "don't"]
    huge = " ".join(words[i] for i in rng.integers(0, len(words), 200_000))[: 1 << 20]
    sparse = " " * 9000 + "y " * 600  # the first prefix is all spaces: too few tokens to tell
    texts = [huge, sparse, "short text"]
    got = _spec(backend_json, 512, backend).build()(texts)
    assert first_mismatch(got, _spec(backend_json, 512).build()(texts)) is None and got.truncated[:2].all()
    assert max(handed) < 20 * 512 * 4 and len(huge) == 1 << 20
