"""Throughput benchmark: pooljobs end to end against its anchors, in one process run.

    python -m bench --tokenizer DIR [--docs 40000] [--shapes minilm,bert-base,bert-large,qwen3-0.6b] [--profile]
                    [--tokenize-in auto|threads|tasks]

For each random-init model shape it runs, on the same corpus and GPU:
  * pooljobs end to end: Parquet in -> one Ray GPU actor -> embedding Parquet out
    (timed from the loaded actor's first unit to the last commit; load reported apart),
  * sentence-transformers `encode` (batch 256),
  * a plain transformers loop (tokenizer `__call__`, padded batches of 256),
and prints tokens/s, rows/s, MFU and the ratios, plus the cosine between pooljobs' output
and the padded reference on every row it ran (must be >= 0.999 in bf16).

`--anchor-docs N` runs the two anchors on the corpus's first N docs only (default: all):
a long pooljobs run measures its steady state (the first unit's ramp and the last unit's
commit are a small share of it) while the anchors, whose rate does not depend on the corpus
size, stay within the device's time. Ratios are then of tokens/s, each over the tokens it ran.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, kind
    "minilm": (384, 6, 12, 12, 1536, "bert"),
    "bert-base": (768, 12, 12, 12, 3072, "bert"),
    "bert-large": (1024, 24, 16, 16, 4096, "bert"),
    "qwen3-0.6b": (1024, 28, 16, 8, 3072, "qwen3"),
    "tiny": (32, 2, 2, 2, 64, "bert"),  # CPU smoke runs of the benchmark scripts
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def make_corpus(tokenizer_dir: Path, docs: int, seed: int = 0) -> list[str]:
    """Texts of real WordPiece words whose token counts are log-normal: median 71,
    p90 211, capped at 510 (+2 special tokens = 512)."""
    vocab = [w for w in (tokenizer_dir / "vocab.txt").read_text().split("\n")
             if w.isalpha() and w.isascii() and not w.startswith("[")]
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(math.log(71), math.log(211 / 71) / 1.2816, docs), 1, 510).astype(int)
    words = np.array(vocab)
    return [" ".join(words[rng.integers(0, len(words), n)]) for n in lengths]


def write_corpus(texts: list[str], path: Path) -> None:
    """The corpus as the Parquet input every pooljobs run of the benchmarks reads."""
    pq.write_table(pa.table({"id": np.arange(len(texts)), "text": texts}), path, row_group_size=5000)


def tokenize_corpus(tokenizer_dir: Path, texts: list[str]):
    """pooljobs' own tokenizing of the corpus (no padding, truncation at 512): an `Encoded`."""
    from workers.tokenize import BatchTokenizer

    return BatchTokenizer((tokenizer_dir / "tokenizer.json").read_text(), 512, False)(texts)


def pooling_of(shape: str) -> str:
    """Decoder shapes pool their last token, encoders the mean."""
    return "last" if SHAPES[shape][5] == "qwen3" else "mean"


def corpus_job(tokenizer_dir: Path, docs: int, shape: str, unit_rows: int, prefix: str):
    """A fresh temp folder with the corpus and a random-init model of `shape`, and the
    job over them that the in-actor benchmarks (`bench.groups`, `bench.timeline`) run."""
    from jobs.spec import JobSpec

    root = Path(tempfile.mkdtemp(prefix=prefix))
    write_corpus(make_corpus(tokenizer_dir, docs), root / "corpus.parquet")
    model_dir = build_model(shape, tokenizer_dir, root)
    return JobSpec(input=str(root / "corpus.parquet"), output=str(root / "out"), model=str(model_dir), id_column="id",
                   pooling=pooling_of(shape), normalize=True, unit_rows=unit_rows, progress=None)


def build_model(shape: str, tokenizer_dir: Path, root: Path) -> Path:
    from transformers import BertConfig, BertModel, Qwen3Config, Qwen3Model

    hidden, layers, heads, kv, inter, kind = SHAPES[shape]
    torch.manual_seed(0)
    if kind == "bert":
        model = BertModel(BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                     intermediate_size=inter, vocab_size=30522), add_pooling_layer=False)
    else:
        model = Qwen3Model(Qwen3Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                       num_key_value_heads=kv, intermediate_size=inter, head_dim=128,
                                       vocab_size=30522, max_position_embeddings=2048, pad_token_id=0))
    out = root / shape
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def flops_per_row(shape: str, length: np.ndarray) -> np.ndarray:
    """Forward FLOPs of real tokens: 2 x matmul weights per token plus attention's
    QK^T and AV (4 x len^2 x hidden per layer); embeddings excluded."""
    hidden, layers, heads, kv, inter, kind = SHAPES[shape]
    head_dim = 128 if kind == "qwen3" else hidden // heads
    proj = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    mlp = (3 if kind == "qwen3" else 2) * hidden * inter
    return layers * (2 * (proj + mlp) * length + 4 * length**2 * heads * head_dim)


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def run_pooljobs(model_dir: Path, corpus: Path, out: Path, pooling: str, args: argparse.Namespace
                 ) -> tuple[float, dict, np.ndarray]:
    from jobs.driver import init_ray, run_job
    from jobs.spec import JobSpec

    init_ray(None)
    spec = JobSpec(input=str(corpus), output=str(out), model=str(model_dir), id_column="id", pooling=pooling,
                   normalize=True, num_workers=1, overwrite=True, unit_rows=args.unit_rows, progress=None,
                   compile="on",  # the steady state of a large job (auto compiles only past a planned size)
                   tokenize_in=args.tokenize_in, **({"window_rows": args.window_rows} if args.window_rows else {}))
    outcome = run_job(spec)
    assert outcome.ok, outcome.failed
    shard = next((out / "data").glob("*.parquet"))
    provenance = json.loads(pq.read_schema(shard).metadata[b"pooljobs"])
    outcome.report["tokenizer"] = {k: provenance.get(k) for k in ("tokenizer", "tokenizer_bounded", "tokenizer_fallback")}
    table = pq.read_table(out, columns=["id", "embedding"]).sort_by("id")
    emb = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    return outcome.report["run_seconds"], outcome.report, emb


def run_st(model_dir: Path, texts: list[str], batch: int, pooling: str) -> tuple[float, np.ndarray]:
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(str(model_dir), max_seq_length=512, model_args={"dtype": torch.bfloat16})
    mode = {"mean": "mean", "last": "lasttoken"}[pooling]
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), mode), models.Normalize()],
                             device="cuda")
    st.encode(texts[:512], batch_size=batch)  # warm-up
    out = {}
    seconds = timed(lambda: out.setdefault("e", st.encode(texts, batch_size=batch, convert_to_numpy=True)))
    return seconds, out["e"]


def run_plain(model_dir: Path, texts: list[str], pooling: str, batch: int = 256) -> tuple[float, np.ndarray]:
    """The loop most people write: tokenizer(...) padded, model(...), pool, in input order."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    chunks = []

    def loop() -> None:
        with torch.inference_mode():
            for i in range(0, len(texts), batch):
                enc = tok(texts[i : i + batch], padding=True, truncation=True, max_length=512, return_tensors="pt").to("cuda")
                hidden = model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"]
                if pooling == "mean":
                    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
                else:
                    pooled = hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1]
                chunks.append(torch.nn.functional.normalize(pooled, dim=1).cpu())

    seconds = timed(loop)
    return seconds, torch.cat(chunks).numpy()


def profile_forward(model_dir: Path, texts: list[str], pooling: str, window: int = 8192) -> None:
    """Where one window's time goes, in-process: tokenize, pack, and the device's top
    kernels for the forward (torch.profiler), so a short device lease yields a profile."""
    from torch.profiler import ProfilerActivity, profile

    from jobs.spec import JobSpec
    from workers.packing import build_pack, plan_packs
    from states.runtime import Runtime
    from workers.batching import MAX_SEQS_PER_PACK
    from workers.unit import UnitRunner

    spec = JobSpec(input="-", output="-", model=str(model_dir), pooling=pooling)
    runner = UnitRunner(spec.unit_options, Runtime(spec.model_options), model_sha256="-")  # writes no shard
    tokenize = runner.tokenizer.tokenize
    batch = texts[:window]
    t = time.perf_counter()
    enc = tokenize(batch)
    tokenize_s = time.perf_counter() - t
    t = time.perf_counter()
    packs = [build_pack(enc, plan).pin_memory() for plan in plan_packs(enc.lengths, runner.max_tokens, MAX_SEQS_PER_PACK,
                                                                    runner.runtime.packed)]
    pack_s = time.perf_counter() - t
    run = lambda: [runner.runtime.compute(p.to("cuda", non_blocking=True)) for p in packs]  # noqa: E731
    run()  # warm-up
    forward_s = timed(run)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    tokens = int(enc.lengths.sum())
    print(f"#   profile {model_dir.name} (compiled: {runner.runtime.compiled}): {tokens:,} tokens in {len(packs)} packs: "
          f"tokenize {tokenize_s * 1e3:.0f} ms "
          f"({tokens / tokenize_s / 1e6:.2f}M/s), pack+pin {pack_s * 1e3:.0f} ms, forward {forward_s * 1e3:.0f} ms "
          f"({tokens / forward_s / 1e6:.2f}M/s)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    runner.close()


def bench_shape(shape: str, args: argparse.Namespace, texts: list[str], lengths: np.ndarray, corpus: Path, root: Path) -> dict:
    """One shape: pooljobs end to end, the transformers loop and sentence-transformers; prints its table rows."""
    tokens = int(lengths.sum())
    pooling = pooling_of(shape)
    model_dir = build_model(shape, args.tokenizer, root)
    flops = float(flops_per_row(shape, lengths).sum())
    if args.profile:
        profile_forward(model_dir, texts, pooling)
    pj_s, report, pj_emb = run_pooljobs(model_dir, corpus, root / f"out-{shape}", pooling, args)
    print(f"#   {shape}: pooljobs {pj_s:.1f}s", flush=True)
    anchor = min(args.anchor_docs or len(texts), len(texts))
    plain_s, ref = run_plain(model_dir, texts[:anchor], pooling)
    print(f"#   {shape}: transformers loop {plain_s:.1f}s over {anchor:,} docs", flush=True)
    st_s = run_st(model_dir, texts[:anchor], 256, pooling)[0]
    cos = (pj_emb[:anchor] * ref).sum(1) / (np.linalg.norm(pj_emb[:anchor], axis=1) * np.linalg.norm(ref, axis=1))
    part = (tokens, len(texts), flops)
    anchor_part = (int(lengths[:anchor].sum()), anchor, float(flops_per_row(shape, lengths[:anchor]).sum()))
    runs = [("pooljobs e2e", pj_s, part), ("transformers loop", plain_s, anchor_part), ("ST encode b256", st_s, anchor_part)]
    st_rate = anchor_part[0] / st_s
    for name, sec, (n_tokens, n_docs, n_flops) in runs:
        mfu = n_flops / sec / (args.peak_tflops * 1e12)
        agreement = f"{cos.min():.5f}" if name == "pooljobs e2e" else ""
        print(f"| {shape} | {name} | {n_tokens / sec:,.0f} | {n_docs / sec:,.0f} | {mfu:.1%} | {n_tokens / sec / st_rate:.2f}x | {agreement} |")
    rows = [(name, sec) for name, sec, _ in runs]
    busy = report["stage_seconds"]["forward"] / pj_s
    print(f"#   pooljobs {shape}: tokenizer {report['tokenizer']}, tokenize_in={args.tokenize_in}", flush=True)
    print(f"#   pooljobs {shape}: device busy {busy:.1%} of the run, padding efficiency {report['padding_efficiency']:.3f}, stage seconds "
          f"{ {k: round(v, 2) for k, v in report['stage_seconds'].items()} }, worker {report['workers'][0]}", flush=True)
    assert cos.min() >= 0.999, f"{shape}: pooljobs disagrees with the padded reference (min cos {cos.min():.5f})"
    return {"shape": shape, "tokens": tokens, "docs": len(texts), "anchor_docs": anchor, "seconds": dict(rows),
            "min_cos": float(cos.min()),
            "report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="directory with a WordPiece tokenizer (BERT vocab)")
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--anchor-docs", type=int, help="run the anchors on the first N docs only (default: all)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--peak-tflops", type=float, default=792.0, help="measured bf16 matmul peak of the GPU")
    parser.add_argument("--unit-rows", type=int, default=20_000, help="pooljobs' rows per work unit")
    parser.add_argument("--window-rows", type=int, help="pooljobs' rows per tokenizing window (default: the job default)")
    parser.add_argument("--tokenize-in", default="auto", choices=("auto", "threads", "tasks"),
                        help="where pooljobs' GPU worker tokenizes (the job option)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--profile", action="store_true", help="also profile one window per shape in-process")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "the benchmark needs a CUDA GPU"

    texts = make_corpus(args.tokenizer, args.docs)
    root = Path(tempfile.mkdtemp(prefix="pooljobs-bench-"))
    corpus = root / "corpus.parquet"
    write_corpus(texts, corpus)
    lengths = tokenize_corpus(args.tokenizer, texts).lengths  # so MFU counts pooljobs' tokens
    tokens = int(lengths.sum())
    print(f"# {torch.cuda.get_device_name()} | torch {torch.__version__} | {platform.node()}")
    print(f"# corpus: {len(texts):,} docs, {tokens:,} tokens, mean {lengths.mean():.0f}, p50 {np.median(lengths):.0f}, "
          f"p90 {np.percentile(lengths, 90):.0f}, max {lengths.max()}")
    print("| shape | path | tokens/s | rows/s | MFU | vs ST-256 | min cos vs padded ref |")
    print("|---|---|---|---|---|---|---|")
    results, failed = [], []
    for shape in args.shapes.split(","):
        try:
            results.append(bench_shape(shape, args, texts, lengths, corpus, root))
        except Exception:  # one shape failing (e.g. out of device memory) still reports the others
            traceback.print_exc()
            failed.append(shape)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if failed:
        raise SystemExit(f"failed shapes: {failed}")


if __name__ == "__main__":
    main()
