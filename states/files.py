"""A model's files, without torch: where a model is, whether its weights may be loaded,
and its identity. The front door and the driver use these before anything heavy loads.

Models load from local directories, or from hub ids already in the local Hugging Face
cache (never the network at run time). Safetensors are preferred; pickle weights (`.bin`,
`.pt`) run arbitrary code on load and are refused unless the caller allows them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from states.errors import ModelLoadError

_SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
_PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model",
)
# Files that hold a vocabulary (tokenizer_config.json alone makes transformers build an
# empty one, in which every word is unknown).
VOCABULARY_FILES = tuple(n for n in _TOKENIZER_FILES if n != "tokenizer_config.json") + ("merges.txt",)
# What the fingerprint leaves out: documentation, and exports pooljobs never runs.
_NOT_MODEL = (".md", ".txt.lock", ".lock")
_NOT_MODEL_DIRS = {"onnx", "openvino", ".git", ".cache"}
# Ordinary English every text tokenizer must mostly know.
CHECK_TEXT = "The quick brown fox jumps over the lazy dog."
MAX_UNKNOWN = 0.5
# A file changed this recently may change again within its timestamp's tick: not cached.
RACY_SECONDS = 2
MAX_CACHED = 256  # fingerprints kept (one small file per model directory); the oldest go first


def resolve_model(model: str | Path, revision: str | None = None) -> Path:
    """A local directory as given, or a hub id's snapshot in the local Hugging Face cache
    (no network: `snapshot_download(..., local_files_only=True)`)."""
    path = Path(model)
    if path.is_dir():
        if revision is not None:
            raise ModelLoadError(f"revision={revision!r} applies to hub ids; {path} is a local directory")
        return path
    text = str(model)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1 or "/" not in text:
        raise ModelLoadError(f"model path {path} is not a directory (pooljobs loads local model directories, "
                             "or hub ids such as BAAI/bge-small-en-v1.5 from the local Hugging Face cache)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError) as e:
        raise ModelLoadError(
            f"{text}{'@' + revision if revision else ''} is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}; set HF_HUB_CACHE or HF_HOME to use another) and pooljobs does not "
            f"download at run time: fetch it first (huggingface-cli download {text}), or pass a local directory"
        ) from e


def check_weights(path: Path, allow_pickle: bool) -> None:
    """`path` holds a transformers config and weights pooljobs may load."""
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json; is it a transformers model directory?")
    if any((path / name).exists() for name in _SAFE_WEIGHTS):
        return
    pickles = [name for name in _PICKLE_WEIGHTS if (path / name).exists()]
    if pickles and not allow_pickle:
        raise ModelLoadError(
            f"{path} has only pickle weights ({pickles[0]}), which can run code when loaded; "
            "convert them to safetensors, or pass --allow-pickle if you trust the source"
        )
    if not pickles:
        raise ModelLoadError(f"{path} holds no weights (looked for {_SAFE_WEIGHTS + _PICKLE_WEIGHTS})")


def check_model_dir(model: str | Path, allow_pickle: bool, revision: str | None = None) -> Path:
    """The model's directory (a hub id resolved in the local cache), once it is known to
    hold a config and loadable weights (a sentence-transformers export: at least its
    modules.json; its Transformer's folder is checked when the pipeline is read)."""
    path = resolve_model(model, revision)
    if not (path / "modules.json").exists():
        check_weights(path, allow_pickle)
    return path


def _model_files(model_dir: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_MODEL_DIRS)
        files += [Path(root, n) for n in sorted(names) if not n.endswith(_NOT_MODEL) and not n.startswith(".")]
    return files


def fingerprint(model_dir: Path, cached: bool = True) -> str:
    """sha256 over every file that can change the outputs (names and contents): config and
    weights, every tokenizer file, every sentence-transformers module's config and weights,
    prompts; documentation and ONNX/OpenVINO exports are left out.

    `cached`: reuse the hash an earlier call stored under `cache_root()/fingerprints`
    while every file's (name, size, mtime, ctime, inode, device) is as it was then.
    Rewriting a file changes its ctime, which no tool can set back, so a stale entry
    needs a change of content within one timestamp tick of the hashing: files changed
    in the last `RACY_SECONDS` are never cached (git's "racy" rule)."""
    files = _model_files(model_dir)
    if not cached:
        return _hash_files(model_dir, files)
    entry = _cache_file(model_dir)
    stats = _stats(model_dir, files)
    try:
        stored = json.loads(entry.read_text())
        if stored.get("model_dir") == str(model_dir.resolve()) and stored.get("files") == stats:
            return stored["sha256"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    digest = _hash_files(model_dir, files)
    newest = max((max(s[2], s[3]) for s in stats), default=0)
    if stats == _stats(model_dir, files) and time.time_ns() - newest > RACY_SECONDS * 1e9:
        store_cached(entry, {"model_dir": str(model_dir.resolve()), "files": stats, "sha256": digest})
    return digest


def cache_root() -> Path:
    """The folder of pooljobs' caches: `POOLJOBS_CACHE`, else `~/.cache/pooljobs`."""
    return Path(os.environ.get("POOLJOBS_CACHE") or Path.home() / ".cache" / "pooljobs")


def _cache_file(model_dir: Path) -> Path:
    name = hashlib.sha256(str(model_dir.resolve()).encode()).hexdigest()[:32]
    return cache_root() / "fingerprints" / f"{name}.json"


def _stats(model_dir: Path, files: list[Path]) -> list[list]:
    """Per file: [relative name, size, mtime_ns, ctime_ns, inode, device] (links followed)."""
    out = []
    for file in files:
        st = file.stat()
        out.append([file.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                    st.st_dev])
    return out


def _hash_files(model_dir: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(model_dir).as_posix().encode() + b"\0")
        with file.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def store_cached(entry: Path, record: dict) -> None:
    """Write `record` (JSON) atomically, keeping the `MAX_CACHED` newest entries of its folder;
    a cache that cannot be written is only a cache."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return
    with contextlib.suppress(OSError):
        entries = sorted(entry.parent.glob("*.json"), key=lambda e: e.stat().st_mtime_ns)
        for old in entries[:-MAX_CACHED]:
            old.unlink()
