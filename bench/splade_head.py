"""Device time of SPLADE's pooling over a pack, by part: the MLM head's logits alone (as saved,
and with the vocabulary padded as the job runs it), then the whole max pooling
(`SpladeHead.weights`: cuBLAS logits per chunk, then the scatter path or the Triton segment
max, for several chunk sizes and segment max tiles), on a random BERT MLM head of the shape.

    python -m bench.splade_head [--shape bert-base] [--tokens 65536] [--mean-length 100]

Sequence lengths are drawn log-normal around the mean (a pack of the bench corpus); every
variant's pooled weights are checked equal to the scatter path's before timing.
"""

from __future__ import annotations

import argparse
import copy
from functools import partial
from unittest import mock

import numpy as np
import torch

from bench.__main__ import SHAPES
from states import segment_max, sparse
from states.segment_max import segment_max_

CHUNKS = (2048, 4096, 8192)  # tokens of logits per segment max
SEGMENT_TILES = ((64, 128), (16, 512), (8, 1024), (4, 2048), (8, 2048))  # segment max (BLOCK_T, BLOCK_V)


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
    saved = copy.deepcopy(head)
    splade = sparse.SpladeHead(head, {})  # pads the head's vocabulary in place
    default_chunk = sparse.LOGITS_PER_CHUNK // splade.vocab

    def pooling(use_triton: bool, chunk: int = default_chunk,
                block: tuple[int, int] = (segment_max.BLOCK_T, segment_max.BLOCK_V)):
        def run() -> torch.Tensor:
            with mock.patch.object(sparse, "segment_max_", partial(segment_max_, use_triton=use_triton)), \
                    mock.patch.object(sparse, "LOGITS_PER_CHUNK", chunk * splade.vocab), \
                    mock.patch.multiple(segment_max, BLOCK_T=block[0], BLOCK_V=block[1]):
                return splade.weights(states, cu)
        return run

    def logits(module):
        return lambda: [module(states[s:s + default_chunk]) for s in range(0, tokens, default_chunk)]

    parts = {f"logits alone per {default_chunk} tokens, vocabulary as saved": logits(saved),
             f"logits alone per {default_chunk} tokens, vocabulary padded to {sparse.VOCAB_ALIGN}": logits(head),
             f"max pooling, logits per {default_chunk} tokens + scatter_reduce_": pooling(False)}
    parts.update({f"max pooling, logits per {chunk} tokens + Triton segment max {block}": pooling(True, chunk, block)
                  for chunk in CHUNKS for block in SEGMENT_TILES})
    parts[f"max pooling as the job runs it (per {default_chunk} tokens, tile "
          f"{(segment_max.BLOCK_T, segment_max.BLOCK_V)})"] = pooling(True)
    with torch.inference_mode():
        want = pooling(False)()
        for chunk in CHUNKS:
            for block in SEGMENT_TILES:
                assert torch.equal(pooling(True, chunk, block)(), want)
        times = {name: cuda_ms(fn) for name, fn in parts.items()}
    print(f"# {args.shape} MLM head, {tokens:,} tokens in {len(lengths)} sequences, vocabulary {config.vocab_size:,}")
    print("| part | ms per pack | ns per token |\n|---|---|---|")
    for name, ms in times.items():
        print(f"| {name} | {ms:.2f} | {ms * 1e6 / tokens:.1f} |")


if __name__ == "__main__":
    main()
