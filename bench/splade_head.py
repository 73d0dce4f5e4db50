"""Device time of SPLADE's pooling over a pack, by part: the MLM head's logits alone (as saved,
and with the vocabulary padded), then the whole max pooling (`SpladeHead.weights`) unfused
(cuBLAS logits per chunk of tokens, then the scatter path or the Triton segment max, for several
chunk sizes and tiles) and fused
(`linear_segment_max_`, for several tile shapes), on a random BERT MLM head of the shape.

    python -m bench.splade_head [--shape bert-base] [--tokens 65536] [--mean-length 100]

Sequence lengths are drawn log-normal around the mean (a pack of the bench corpus); every
path's pooled weights are checked against the unfused scatter path's before timing (equal
for the unfused paths, close for the fused ones, whose maxima are of float32 products).
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
from states.segment_max import GemmTiles, linear_segment_max_, segment_max_

TILES = (GemmTiles(128, 256, 64, 8, 8, 3), GemmTiles(128, 256, 64, 16, 8, 3),
         GemmTiles(128, 256, 64, 8, 8, 3, True), GemmTiles(128, 256, 64, 8, 8, 4, True),
         GemmTiles(128, 128, 64, 8, 4, 4, True), GemmTiles(128, 128, 64, 8, 8, 4, True),
         GemmTiles(256, 128, 64, 8, 8, 3, True), GemmTiles(128, 256, 128, 8, 8, 2, True),
         GemmTiles(64, 256, 64, 8, 4, 4, True))
CHUNKS = (2048, 4096, 8192)  # tokens of cuBLAS logits per segment max
SEGMENT_TILES = ((16, 512), (128, 128), (8, 1024), (32, 512))  # segment max (BLOCK_T, BLOCK_V)


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
    splade = sparse.SpladeHead(head, {})  # splits and pads the head in place

    def unfused(use_triton: bool, chunk: int = sparse.CHUNK_TOKENS,
                block: tuple[int, int] = (segment_max.BLOCK_T, segment_max.BLOCK_V)):
        def run() -> torch.Tensor:
            with mock.patch.object(sparse, "fuses", lambda *_: False), \
                    mock.patch.object(sparse, "segment_max_", partial(segment_max_, use_triton=use_triton)), \
                    mock.patch.object(sparse, "CHUNK_TOKENS", chunk), \
                    mock.patch.multiple(segment_max, BLOCK_T=block[0], BLOCK_V=block[1]):
                return splade.weights(states, cu)
        return run

    def fused(tiles: GemmTiles):
        def run() -> torch.Tensor:
            with mock.patch.object(sparse, "linear_segment_max_", partial(linear_segment_max_, tiles=tiles)):
                return splade.weights(states, cu)
        return run

    def chunked(module):
        return lambda: [module(states[s:s + sparse.CHUNK_TOKENS]) for s in range(0, tokens, sparse.CHUNK_TOKENS)]

    parts = {"logits alone, vocabulary as saved": chunked(saved),
             f"logits alone, vocabulary padded to {sparse.VOCAB_ALIGN}": chunked(lambda h: splade.decoder(splade.transform(h))),
             "max pooling, cuBLAS logits + scatter_reduce_": unfused(False)}
    parts.update({f"max pooling, cuBLAS logits per {chunk} tokens + Triton segment max {block}": unfused(True, chunk, block)
                  for chunk in CHUNKS for block in SEGMENT_TILES})
    parts.update({f"max pooling, fused product-and-max {tuple(t)}": fused(t) for t in TILES})
    with torch.inference_mode():
        want = unfused(False)()
        for chunk in CHUNKS:
            for block in SEGMENT_TILES:
                assert torch.equal(unfused(True, chunk, block)(), want)
        for tiles in TILES:
            torch.testing.assert_close(fused(tiles)(), want, rtol=2e-2, atol=2e-2)
        times = {name: cuda_ms(fn) for name, fn in parts.items()}
    print(f"# {args.shape} MLM head, {tokens:,} tokens in {len(lengths)} sequences, vocabulary {config.vocab_size:,}; "
          f"tiles (block_t, block_v, block_k, group_t, warps, stages)")
    print("| part | ms per pack | ns per token |\n|---|---|---|")
    for name, ms in times.items():
        print(f"| {name} | {ms:.2f} | {ms * 1e6 / tokens:.1f} |")


if __name__ == "__main__":
    main()
