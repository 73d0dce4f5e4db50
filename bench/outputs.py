"""Sparse (SPLADE) and multivector (ColBERT-style) throughput against dense pooling of the
same model shape, device side, as a job runs them.

    python -m bench.outputs --tokenizer DIR [--shape bert-base] [--docs 20000]

One random fill-mask BERT of the shape is saved as a sentence-transformers SparseEncoder
(Transformer fill-mask + SpladePooling) and its encoder as a MultiVectorEncoder (Transformer
+ token Dense to 128 + MultiVectorMask with the punctuation skiplist), by the installed
sentence-transformers. Each variant loads a `Runtime` (job defaults: bf16, compiled blocks)
and runs the corpus as launch-group packs back to back, each pack's outputs copied home as
a worker does; tokens/s is real tokens over CUDA time, and each line prints its ratio to
dense (the anchor: the same encoder, mean pooling, on the SparseEncoder's directory).

A random MLM head gives weights to most of the vocabulary (a trained SPLADE model keeps a
few hundred per text), so `sparse` (every nonzero weight) is a worst case for the copy home
and the writer; `sparse-top256` bounds the width as a trained model's sparsity would, and
`sparse-trained` keeps every nonzero weight of a second SparseEncoder whose MLM bias is
lowered until a text of the corpus has `--nonzeros` of them on average (what trained
SPLADE models give documents), the job's default output of such a model.
"""

from __future__ import annotations

import argparse
import shutil
import string
import tempfile
from pathlib import Path

import torch

from bench.__main__ import SHAPES, TOKENIZER_FILES, make_corpus, tokenize_corpus
from bench.forward import device_seconds, group_packs
from states.ragged import Ragged
from states.runtime import ModelOptions, Runtime

# name -> (model: "sparse" | "multivector" directory, ModelOptions overrides)
VARIANTS: dict[str, tuple[str, dict]] = {
    "dense": ("sparse", {"outputs": "dense", "pooling": "mean", "normalize": True}),
    "sparse": ("sparse", {"outputs": "sparse"}),  # every nonzero weight: its width Pending, resolved a pack later
    "sparse-top256": ("sparse", {"outputs": "sparse", "sparse_top_k": 256}),  # a width known to the host
    "sparse-trained": ("trained", {"outputs": "sparse"}),  # every nonzero weight, trained-like sparsity
    "dense+sparse": ("sparse", {"outputs": "dense,sparse", "pooling": "mean", "sparse_top_k": 256}),
    "multivector": ("multivector", {"outputs": "multivector"}),
    "multivector-dense": ("multivector", {"outputs": "dense", "pooling": "mean"}),
}


def lower_bias(mlm, tokenizer_dir: Path, nonzeros: int) -> None:
    """Shifts `mlm`'s vocabulary bias down so that max pooling over a text's tokens leaves
    about `nonzeros` positive weights per text, on 64 texts of the corpus (CPU, float32)."""
    enc = tokenize_corpus(tokenizer_dir, make_corpus(tokenizer_dir, 64, seed=1))
    with torch.no_grad():
        pooled = torch.stack([mlm(input_ids=torch.from_numpy(enc.sequence(m)).long()[None]).logits[0].amax(0)
                              for m in range(len(enc.lengths))])  # (64, V)
        mlm.cls.predictions.bias -= torch.quantile(pooled.flatten()[::7], 1 - nonzeros / pooled.shape[1])


def build_models(shape: str, tokenizer_dir: Path, root: Path, nonzeros: int) -> dict[str, Path]:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    hidden, layers, heads, _, inter, kind = SHAPES[shape]
    assert kind == "bert", "fill-mask shapes only"
    torch.manual_seed(0)
    mlm, trained = root / "mlm", root / "mlm-trained"
    model = BertForMaskedLM(BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                       intermediate_size=inter, vocab_size=30522)).eval()
    model.save_pretrained(mlm)
    lower_bias(model, tokenizer_dir, nonzeros)
    model.save_pretrained(trained)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, mlm / name)
        shutil.copy(tokenizer_dir / name, trained / name)
    paths = {"sparse": root / "splade", "trained": root / "splade-trained", "multivector": root / "colbert"}
    for key, weights in (("sparse", mlm), ("trained", trained)):
        SparseEncoder(modules=[Transformer(str(weights), transformer_task="fill-mask"), SpladePooling("max")],
                      device="cpu").save(str(paths[key]))
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    projection = Dense(hidden, 128, bias=False, activation_function=torch.nn.Identity(),
                       module_input_name="token_embeddings", module_output_name="token_embeddings")
    MultiVectorEncoder(modules=[Transformer(str(mlm)), projection, MultiVectorMask(list(string.punctuation))],
                       device="cpu").save(str(paths["multivector"]))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--shape", default="bert-base", choices=[s for s, v in SHAPES.items() if v[5] == "bert"])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--max-tokens", type=int, default=1 << 16)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--nonzeros", type=int, default=256, help="sparse-trained's mean nonzero weights per text")
    args = parser.parse_args()

    paths = build_models(args.shape, args.tokenizer, Path(tempfile.mkdtemp(prefix="pooljobs-outputs-")), args.nonzeros)
    enc = tokenize_corpus(args.tokenizer, make_corpus(args.tokenizer, args.docs))
    tokens = int(enc.offsets[-1])
    print(f"# {args.shape}: {tokens:,} tokens, packs of <= {args.max_tokens:,} tokens")
    anchor = None
    for name in args.variants.split(","):
        model, overrides = VARIANTS[name]
        runtime = Runtime(ModelOptions(str(paths[model]), device="cuda", **overrides))
        packs = group_packs(enc, args.max_tokens, runtime.state.packed)
        device_seconds(runtime, packs, copy_home=True)  # first use of each pack size
        best = min(device_seconds(runtime, packs, copy_home=True) for _ in range(3))
        anchor = anchor or (best if name == "dense" else None)
        ratio = f"{best / anchor:.2f}x dense's time" if anchor else "(no dense anchor)"
        ragged = [v for v in runtime.compute(packs[0].to("cuda")).values() if isinstance(v, Ragged)]
        items = f"{ragged[0].lengths.float().mean().item():,.0f} items per row" if ragged else ""
        print(f"| {args.shape} | {name} | {tokens / best:,.0f} tokens/s | {best * 1e3:.0f} ms | {ratio} | {items} |",
              flush=True)
        del runtime
        torch.cuda.empty_cache()
        torch._dynamo.reset()  # each variant's compiled blocks start afresh, as in a job's process


if __name__ == "__main__":
    main()
