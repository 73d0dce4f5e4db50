"""Device time of SPLADE's pooling over a pack, by part: the MLM head's logits alone (as saved, and padded as the job runs it), then
the whole max pooling (`SpladeHead.weights`) with the scatter path and with the Triton
segment max, on a random BERT MLM head of the shape.

    python -m bench.splade_head [--shape bert-base] [--tokens 65536] [--mean-length 100]

Sequence lengths are drawn log-normal around the mean (a pack of the bench corpus); the
pooled weights of both paths are checked equal before timing.
"""

from __future__ import annotations

import argparse
import copy
from functools import partial
from unittest import mock

import numpy as np
import torch

from bench.__main__ import SHAPES
from states import sparse
from states.segment_max import segment_max_


def cuda_ms(fn, repeat: int = 10) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def main() -> None:
    from transformers import BertConfig, BertForMaskedLM

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="bert-base", choices=[s for s, v in SHAPES.items() if v[5] == "bert"])
    parser.add_argument("--tokens", type=int, default=1 << 16)
    parser.add_argument("--mean-length", type=float, default=100.0)
    args = parser.parse_args()
    hidden, layers, heads, _, inter, _ = SHAPES[args.shape]
    config = BertConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads, intermediate_size=inter)
    head = BertForMaskedLM(config).cls.to("cuda", torch.bfloat16).eval()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(args.mean_length) - 0.5, 1.0, args.tokens), 1, 512).astype(np.int64)
    lengths = lengths[:np.searchsorted(lengths.cumsum(), args.tokens) + 1]
    tokens = int(lengths.sum())
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.from_numpy(lengths).cuda().cumsum(0)
    states = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    unpadded = copy.deepcopy(head)
    splade = sparse.SpladeHead(head, {})  # pads the head's vocabulary in place

    def with_path(use_triton: bool):
        def run() -> torch.Tensor:
            with mock.patch.object(sparse, "segment_max_", partial(segment_max_, use_triton=use_triton)):
                return splade.weights(states, cu)
        return run

    with torch.inference_mode():
        assert torch.equal(with_path(True)(), with_path(False)())
        unpadded_ms = cuda_ms(lambda: [unpadded(states[s:s + sparse.CHUNK_TOKENS]) for s in range(0, tokens, sparse.CHUNK_TOKENS)])
        logits_ms = cuda_ms(lambda: [head(states[s:s + sparse.CHUNK_TOKENS]) for s in range(0, tokens, sparse.CHUNK_TOKENS)])
        scatter_ms = cuda_ms(with_path(False))
        triton_ms = cuda_ms(with_path(True))
    print(f"# {args.shape} MLM head, {tokens:,} tokens in {len(lengths)} sequences, vocabulary {config.vocab_size:,}")
    print("| part | ms per pack | ns per token |\n|---|---|---|")
    for name, ms in (("logits alone, vocabulary as saved", unpadded_ms),
                     (f"logits alone, vocabulary padded to {sparse.VOCAB_ALIGN}", logits_ms), ("max pooling, scatter_reduce_", scatter_ms),
                     ("max pooling, Triton segment max", triton_ms)):
        print(f"| {name} | {ms:.2f} | {ms * 1e6 / tokens:.1f} |")


if __name__ == "__main__":
    main()
