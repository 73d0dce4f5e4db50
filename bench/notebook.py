"""Notebook calls, as a user of one Python session makes them: `jobs.embed`, `jobs.classify`
and `jobs.score` on the same in-memory table, each called twice, against the tool each one
replaces, loaded once and timed on the same table.

    python -m bench.notebook --tokenizer DIR [--shape bert-base] [--rows 40000] [--device cuda]

The models are random-init `--shape` BERTs saved by the installed transformers with the
WordPiece files of `--tokenizer`: a plain encoder (embed, mean pooling), a 3-label sequence
classifier (classify) and a 1-label one (score, the cross-encoder layout). The anchors:
`SentenceTransformer.encode`, transformers' `text-classification` pipeline and
`CrossEncoder.predict` (fp16 on CUDA, batches of 256), each warmed up on
512 rows first, so they are timed as a loaded model in a notebook is. Per task it prints
both calls' walls, the second call's overhead over its own steady run (`run_seconds` of the
job's report) and the anchor's time over the second call's. The targets of issue 18: the
first call within its steady run + 15 s, the second within its steady run + 2 s and at
least 4x faster than the anchor.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import torch

from bench.__main__ import SHAPES, TOKENIZER_FILES, build_model, make_corpus

LABELS = {"classify": 3, "score": 1}


def build_head_model(shape: str, tokenizer_dir: Path, root: Path, labels: int) -> Path:
    """A random `shape` BERT with a `labels`-way sequence-classification head, saved."""
    from transformers import BertConfig, BertForSequenceClassification

    hidden, layers, heads, _, inter, kind = SHAPES[shape]
    assert kind == "bert", "BERT shapes only"
    torch.manual_seed(labels)
    names = {i: f"label-{i}" for i in range(labels)}
    model = BertForSequenceClassification(BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                                                     num_attention_heads=heads, intermediate_size=inter,
                                                     vocab_size=30522, num_labels=labels, id2label=names,
                                                     label2id={v: k for k, v in names.items()}))
    out = root / f"{shape}-{labels}-labels"
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def anchor(task: str, model: Path, table: pa.Table, device: str) -> float:
    """Seconds of the replaced tool over the whole table, its model loaded and warmed up."""
    texts = table.column("text").to_pylist()
    half = torch.float16 if device.startswith("cuda") else torch.float32
    if task == "embed":
        from sentence_transformers import SentenceTransformer

        m = SentenceTransformer(str(model), device=device).to(half)
        run = lambda rows: m.encode(rows, batch_size=256, convert_to_numpy=True, normalize_embeddings=True)  # noqa: E731
    elif task == "classify":
        from transformers import pipeline

        m = pipeline("text-classification", model=str(model), device=device, dtype=half)
        run = lambda rows: m(rows, batch_size=256, truncation=True, top_k=None)  # noqa: E731
    else:
        from sentence_transformers import CrossEncoder

        m = CrossEncoder(str(model), device=device)
        m.model.to(half)
        queries = table.column("query").to_pylist()
        run = lambda rows: m.predict(list(zip(queries[:len(rows)], rows)), batch_size=256)  # noqa: E731
    run(texts[:512])
    t = time.perf_counter()
    run(texts)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--shape", default="bert-base", choices=[s for s, v in SHAPES.items() if v[5] == "bert"])
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tasks", default="embed,classify,score")
    args = parser.parse_args()

    import jobs
    import jobs.driver

    reports = []
    run_job = jobs.driver.run_job

    def keep_report(*a, **k):
        outcome = run_job(*a, **k)
        reports.append(outcome.report)
        return outcome

    jobs.driver.run_job = keep_report  # the API calls it by name at call time
    root = Path(tempfile.mkdtemp(prefix="pooljobs-notebook-"))
    texts = make_corpus(args.tokenizer, args.rows)
    table = pa.table({"text": texts, "query": [" ".join(t.split()[:8]) for t in texts[1:] + texts[:1]]})
    print(f"# notebook calls: {args.shape}, {args.rows:,} rows, device {args.device}, torch {torch.__version__}")
    print("| task | first call s | second call s | second's steady run s | second - steady s | anchor s | "
          "anchor / second |\n|---|---|---|---|---|---|---|", flush=True)
    for task in args.tasks.split(","):
        model = build_model(args.shape, args.tokenizer, root) if task == "embed" else \
            build_head_model(args.shape, args.tokenizer, root, LABELS[task])
        call = {"embed": lambda: jobs.embed(table, model=str(model), device=args.device, pooling="mean",
                                            normalize=True),
                "classify": lambda: jobs.classify(table, model=str(model), device=args.device),
                "score": lambda: jobs.score(table, model=str(model), pair_column="query", device=args.device)}[task]
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            call()
            walls.append(time.perf_counter() - t)
        steady = reports[-1]["run_seconds"]
        base = anchor(task, model, table, args.device)
        print(f"| {task} | {walls[0]:.2f} | {walls[1]:.2f} | {steady:.2f} | {walls[1] - steady:.2f} | {base:.2f} | "
              f"{base / walls[1]:.2f}x |", flush=True)
    jobs.shutdown()


if __name__ == "__main__":
    main()
