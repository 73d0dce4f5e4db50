"""The independent reference a job's outputs are checked against (`jobs.verify --reference`).

Not pooljobs' own path: sentence-transformers itself (`SentenceTransformer.encode`,
`CrossEncoder.predict`) loaded from the model directory, plain transformers with a
padded batch for classification heads, or BGE-M3's sparse and ColBERT heads as
FlagEmbedding computes them (`bge_m3`), on the CPU in float32, with the settings the
job's provenance records (pooling, prompt, route, dim, normalization). The model path and
trust flags are the caller's, never read from the output being checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ReferenceModel:
    """What to load (the caller's) and how the job ran it (its provenance)."""

    model_dir: Path
    task: str
    provenance: dict
    trust_remote_code: bool = False


def _normalize(values: np.ndarray) -> np.ndarray:
    return values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)


def _embed(ref: ReferenceModel, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    prov = ref.provenance
    modes = tuple(prov["pooling"].split("+"))
    max_length = int(prov["max_length"])
    if (ref.model_dir / "modules.json").exists():
        model = SentenceTransformer(str(ref.model_dir), device="cpu", local_files_only=True,
                                    trust_remote_code=ref.trust_remote_code)
        for module in model:
            if isinstance(module, Pooling) and tuple(np.atleast_1d(module.pooling_mode)) != modes:
                module.pooling_mode = modes[0] if len(modes) == 1 else modes
    else:
        trust = {"trust_remote_code": True} if ref.trust_remote_code else {}
        transformer = Transformer(str(ref.model_dir), model_kwargs=trust, processor_kwargs=trust, config_kwargs=trust)
        model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), modes)],
                                    device="cpu")
    model.max_seq_length = max_length
    kwargs = {"task": prov["route"]} if "route" in prov else {}
    values = model.encode(texts, prompt=prov.get("prompt") or None, convert_to_numpy=True, **kwargs)
    values = values.astype(np.float32)
    if (model_normalizes := any(type(m).__name__ == "Normalize" for m in model)) and prov["normalize"] == "False":
        raise ValueError("the job turned the model's Normalize off; the reference cannot undo it")
    if prov["dim"] != "None":
        values = values[:, : int(prov["dim"])]
    if prov["normalize"] == "True" and (prov["dim"] != "None" or not model_normalizes):
        values = _normalize(values)
    return values


def _heads(ref: ReferenceModel, texts: list[str], pairs: list[str] | None) -> dict[str, np.ndarray]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if ref.task == "score":
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(ref.model_dir), device="cpu", local_files_only=True,
                             trust_remote_code=ref.trust_remote_code, max_length=int(ref.provenance["max_length"]))
        return {"score": np.asarray(model.predict(list(zip(texts, pairs))), np.float32).reshape(len(texts), -1)}
    tokenizer = AutoTokenizer.from_pretrained(ref.model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        ref.model_dir, dtype=torch.float32, local_files_only=True, trust_remote_code=ref.trust_remote_code).eval()
    batch = tokenizer(texts, pairs, padding=True, truncation=True, max_length=int(ref.provenance["max_length"]),
                      return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits.float()
    multi = getattr(model.config, "problem_type", None) == "multi_label_classification"
    return {"probs": (torch.sigmoid(logits) if multi else torch.softmax(logits, dim=1)).numpy()}


def _sparse(ref: ReferenceModel, texts: list[str]) -> np.ndarray:
    """`SparseEncoder.encode` as dense (N, vocabulary) weights, cut to the job's top-k and threshold."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(ref.model_dir), device="cpu", local_files_only=True,
                          trust_remote_code=ref.trust_remote_code)
    model.max_seq_length = int(ref.provenance["max_length"])
    values = model.encode(texts, prompt=ref.provenance.get("prompt") or None, convert_to_tensor=True)
    return _cut(values.to_dense().float().numpy(), json.loads(ref.provenance["sparse"]))


def _cut(values: np.ndarray, settings: dict) -> np.ndarray:
    """(N, vocabulary) weights cut to the job's sparse threshold and top-k."""
    if settings["threshold"] is not None:
        values = np.where(values > settings["threshold"], values, 0)
    if settings["top_k"] is not None and settings["top_k"] < values.shape[1]:
        cut = -np.partition(-values, settings["top_k"] - 1, axis=1)[:, settings["top_k"] - 1 : settings["top_k"]]
        values = np.where(values >= cut, values, 0)
    return values


def _multivector(ref: ReferenceModel, texts: list[str]) -> list[np.ndarray]:
    """`MultiVectorEncoder.encode_document`: each row's (kept tokens, d) vectors."""
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

    model = MultiVectorEncoder(str(ref.model_dir), device="cpu", local_files_only=True,
                               trust_remote_code=ref.trust_remote_code)
    model.max_seq_length = int(ref.provenance["max_length"])
    rows = model.encode_document(texts, prompt=ref.provenance.get("prompt") or None)
    return [np.asarray(r, np.float32) for r in rows]


def bge_m3(model_dir: Path, texts: list[str], max_length: int, normalize: bool = True,
           prompt: str = "", dtype: str = "float32",
           device: str = "cpu") -> tuple[np.ndarray, list[dict[int, float]], list[np.ndarray]]:
    """BGE-M3's outputs as FlagEmbedding computes them, written from its code
    (FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py: `_dense_embedding` cls,
    `_sparse_embedding` token weights, `_colbert_embedding`, `F.normalize` of dense and colbert
    under normalize_embeddings; FlagEmbedding/inference/embedder/encoder_only/m3.py:
    `_process_token_weights`, `_process_colbert_vecs`), on one right-padded batch through
    the plain transformers model in `dtype` (float32 for `jobs.verify`; a test's bf16 run on
    the GPU measures the precision's own noise, against which a bf16 job is judged).

    -> (dense (N, H), lexical weights [{token id: weight}], colbert [(tokens - 1, d)])."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype), local_files_only=True).eval().to(device)
    heads = {}
    for name in ("colbert_linear", "sparse_linear"):
        state = torch.load(model_dir / f"{name}.pt", map_location="cpu", weights_only=True)
        heads[name] = torch.nn.Linear(state["weight"].shape[1], state["weight"].shape[0])
        heads[name].load_state_dict(state)
        heads[name].to(device, getattr(torch, dtype))
    batch = tokenizer.pad(tokenizer([prompt + t for t in texts], truncation=True, max_length=max_length),
                          padding=True, return_tensors="pt").to(device)
    with torch.no_grad():
        hidden = model(**batch, return_dict=True).last_hidden_state  # (N, L, H)
        dense = hidden[:, 0]
        token_weights = torch.relu(heads["sparse_linear"](hidden)).squeeze(-1)  # (N, L)
        colbert = heads["colbert_linear"](hidden[:, 1:]) * batch["attention_mask"][:, 1:][:, :, None].to(hidden.dtype)
        if normalize:
            dense, colbert = F.normalize(dense, dim=-1), F.normalize(colbert, dim=-1)
        dense, token_weights, colbert = dense.float().cpu(), token_weights.float().cpu(), colbert.float().cpu()
    batch = batch.to("cpu")
    unused = {tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[t])
              for t in ("cls_token", "eos_token", "pad_token", "unk_token") if t in tokenizer.special_tokens_map}
    lexical = []
    for weights, ids in zip(token_weights.numpy(), batch["input_ids"].tolist()):
        row: dict[int, float] = {}
        for w, i in zip(weights, ids):
            if i not in unused and w > 0 and w > row.get(i, 0):
                row[i] = float(w)
        lexical.append(row)
    vectors = [v[: int(m.sum()) - 1].numpy() for v, m in zip(colbert, batch["attention_mask"])]
    return dense.numpy(), lexical, vectors


def _m3(ref: ReferenceModel, texts: list[str], kinds: list[str]) -> dict[str, np.ndarray | list]:
    """The job's BGE-M3 sparse and multivector outputs (`bge_m3`), sparse as (N, vocabulary)."""
    prov = ref.provenance
    normalize = json.loads(prov["multivector"])["normalize"] if "multivector" in kinds else True
    _, lexical, colbert = bge_m3(ref.model_dir, texts, int(prov["max_length"]), normalize, prov.get("prompt") or "")
    out: dict[str, np.ndarray | list] = {}
    if "sparse" in kinds:
        from transformers import AutoConfig

        weights = np.zeros((len(texts), AutoConfig.from_pretrained(ref.model_dir).vocab_size), np.float32)
        for row, found in enumerate(lexical):
            weights[row, list(found)] = list(found.values())
        out["sparse"] = _cut(weights, json.loads(prov["sparse"]))
    if "multivector" in kinds:
        out["multivector"] = colbert
    return out


def _is_m3(provenance: dict, kind: str) -> bool:
    return kind in provenance and json.loads(provenance[kind]).get("semantics") == "bge-m3"


def compute(ref: ReferenceModel, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray | list]:
    """The reference outputs of these rows, for each output the job wrote: `embedding` (N, D),
    `sparse` (N, vocabulary) dense weights, `multivector` a list of (tokens, d); `score` (N, 1)
    or `probs` (N, C)."""
    if ref.task != "embed":
        return _heads(ref, texts, pairs)
    kinds = ref.provenance.get("outputs", "dense").split(",")
    out: dict[str, np.ndarray | list] = {}
    if "dense" in kinds:
        out["embedding"] = _embed(ref, texts)
    m3 = [k for k in ("sparse", "multivector") if k in kinds and _is_m3(ref.provenance, k)]
    if m3:
        out.update(_m3(ref, texts, m3))
    if "sparse" in kinds and "sparse" not in m3:
        out["sparse"] = _sparse(ref, texts)
    if "multivector" in kinds and "multivector" not in m3:
        out["multivector"] = _multivector(ref, texts)
    return out
