"""A loaded model ready for packs: tokenizer, routed state, the sentence-transformers
pipeline around it, and resolved task settings.

`load_runtime(options)` is the one place a model is loaded (in a test, in-process, or in
a Ray actor); `Runtime.compute(pack)` turns a pack into the task's output tensors, and
`Runtime.launch(pack)` queues them, leaving what only the device can size `Pending`.
"""

from __future__ import annotations

import json

import numpy as np
import torch
from torch import nn

from states import modules
from states.compiling import GeluEpilogue, compile_blocks
from states.interface import ModelState, Pack
from states.loading import DTYPES, check_model_dir, check_weights, fingerprint, load_model, load_tokenizer
from states.multivector import ColbertVectors, TokenVectors, skiplist_ids
from states.options import COMPILE_CHOICES, ModelOptions, parse_outputs
from states.packed import position_offset
from states.pipeline import Pipeline, model_limit, read_pipeline
from states.pooling import check_mode, finish, pool
from states.quantization import calibration_ranges
from states import ragged
from states.ragged import Pending, Ragged
from states.routing import init_model_state
from states.sparse import SpladeHead, sparse_head


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here; use device='cpu' or 'auto'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; choose one of {['auto', *DTYPES]}")
    return DTYPES[dtype]


def _max_length(pipeline: Pipeline, tokenizer, state: ModelState, requested: int | None) -> int:
    """RoBERTa-style embeddings reserve the positions up to padding_idx, as the packed
    path offsets them."""
    positions = getattr(state.config, "max_position_embeddings", None)
    model_max = model_limit(pipeline, getattr(tokenizer, "model_max_length", None),
                            positions - position_offset(state.model) if positions else None)
    if requested is None:
        return model_max
    if requested > model_max:
        raise ValueError(f"max_length={requested} exceeds what the model takes ({model_max})")
    return requested



def resolve_outputs(requested: str, pipeline: Pipeline, task: str) -> tuple[str, ...]:
    """The output kinds to compute: `auto` is what the model was saved as (a SparseEncoder
    sparse, a MultiVectorEncoder multivector, else dense: a BGE-M3 directory too, as its
    sentence-transformers modules and FlagEmbedding's `M3Embedder` default give it);
    classify/score have none."""
    if task != "embed":
        if requested not in ("auto", "dense"):
            raise ValueError(f"outputs={requested!r} is for task='embed'")
        return ()
    if requested != "auto":
        return parse_outputs(requested)
    if pipeline.splade is not None:
        return ("sparse",)
    if pipeline.multivector_mask is not None or pipeline.token_post:
        return ("multivector",)
    return ("dense",)


def score_activation(pipeline: Pipeline, config) -> nn.Module:
    """A cross-encoder's score function, as `CrossEncoder.predict` applies it: the saved
    activation_fn (config_sentence_transformers.json, or config.json as sentence-transformers
    4-5 and < 4 saved it), else sigmoid."""
    saved = (pipeline.activation or (getattr(config, "sentence_transformers", None) or {}).get("activation_fn")
             or getattr(config, "sbert_ce_default_activation_function", None))
    return modules.activation(saved) if saved else nn.Sigmoid()


CPU_TOKEN_BUDGET = 16_384  # tokens per forward on a CPU, where memory is not the limit
FREE_MEMORY_SHARE = 4  # one layer's activations may use 1/4 of the free device memory
HIDDEN_VALUES_PER_TOKEN = 6  # hidden-sized activations one layer keeps per token (q, k, v, output, residuals)
MIN_TOKEN_BUDGET = 2048
MAX_TOKEN_BUDGET = 1 << 19


class Runtime:
    """Everything a worker needs to turn packs into outputs for one model
    (`states.contract.WorkerRuntime`)."""

    def __init__(self, options: ModelOptions) -> None:
        self.options = options
        self.model_dir = check_model_dir(options.model, options.allow_pickle, options.revision)
        self.pipeline = read_pipeline(self.model_dir, options.route)
        source = self.pipeline.transformer_dir
        check_weights(source, options.allow_pickle)
        self.device = resolve_device(options.device)
        self.dtype = resolve_dtype(options.dtype, self.device)
        self.tokenizer = load_tokenizer(source, options.trust_remote_code, self.pipeline)
        self.outputs = resolve_outputs(options.outputs, self.pipeline, options.task)
        model = load_model(
            source, options.task, self.dtype, self.device, trust_remote_code=options.trust_remote_code,
            allow_pickle=options.allow_pickle, allow_missing_weights=options.allow_missing_weights,
            masked_lm="sparse" in self.outputs and self.pipeline.m3_sparse is None,
        )
        self.sparse = (sparse_head(model, self.pipeline, self.tokenizer, options.sparse_top_k,
                                   options.sparse_threshold).to(self.device) if "sparse" in self.outputs else None)
        if isinstance(self.sparse, SpladeHead):  # the fill-mask model's head runs on the pooled side
            model = model.base_model
        self.state: ModelState = init_model_state(model, options.execution, options.state)
        self.max_length = _max_length(self.pipeline, self.tokenizer, self.state, options.max_length)
        if options.pooling != "auto":
            self.pooling: tuple[str, ...] = (check_mode(options.pooling),)
        else:
            self.pooling = self.pipeline.pooling or (check_mode(self.state.default_pooling),)
        self.layer_pooling, self.post, normalized = self._modules()
        self.normalize = normalized if options.normalize is None else options.normalize
        self.token_vectors = self._token_vectors() if "multivector" in self.outputs else None
        self.prompt = self._prompt(options.prompt_name)
        self.prompt_skip = 0 if self.pipeline.include_prompt else self._prompt_length()
        self.labels = self._labels()
        self.activation = score_activation(self.pipeline, self.state.config) if options.task == "score" else None
        self.compiled = self._compile(options.compile)
        self.ragged: frozenset[str] = frozenset()
        self.output_shapes = self.warm_up()
        self.ranges = (calibration_ranges(options.calibration, self.output_shapes["embedding"][0])
                       if options.calibration and "embedding" in self.output_shapes else None)

    def _modules(self) -> tuple[nn.Module | None, list[nn.Module], bool]:
        """(WeightedLayerPooling or None, the post-pooling modules less a final Normalize,
        whether that Normalize was there), on the device in float32."""
        build = lambda spec: modules.build(spec, self.options.allow_pickle).to(self.device)  # noqa: E731
        post = list(self.pipeline.post)
        normalized = bool(post) and post[-1].kind == "Normalize"
        if normalized:
            post.pop()
        # sentence-transformers' WeightedLayerPooling does nothing when the Transformer
        # does not hand its layers on.
        layers = self.pipeline.layer_pooling if self.pipeline.output_hidden_states else None
        return (None if layers is None else build(layers)), [build(s) for s in post], normalized

    def _token_vectors(self) -> TokenVectors:
        """The multivector projection (token modules) and the document skiplist, on the device;
        BGE-M3's ColBERT head where the directory has one, normalized when the dense embedding
        is (FlagEmbedding's one `normalize_embeddings` covers both)."""
        if self.pipeline.m3_colbert is not None:
            hidden = self.state.config.hidden_size
            return ColbertVectors(self.pipeline.m3_colbert, hidden, self.normalize).to(self.device)
        built = [modules.build(s, self.options.allow_pickle) for s in self.pipeline.token_post]
        mask = self.pipeline.multivector_mask
        keep_only = mask.config.get("keep_only_token_ids") if mask is not None else None
        return TokenVectors(built, skiplist_ids(mask, self.tokenizer), keep_only).to(self.device)

    def _compile(self, choice: str) -> bool:
        if choice not in COMPILE_CHOICES:
            raise ValueError(f"compile={choice!r}; choose one of {COMPILE_CHOICES}")
        wanted = choice == "on" or (choice == "auto" and self.device.type == "cuda" and self.state.packed)
        return wanted and compile_blocks(self.state.model, gelu=GeluEpilogue() if self._epilogue_wanted else None) > 0

    @property
    def _epilogue_wanted(self) -> bool:
        """fp32 runs are references: their GELU stays exact, as with `exact_gelu`."""
        return not self.options.exact_gelu and self.dtype in (torch.float16, torch.bfloat16)

    @property
    def gelu_epilogue(self) -> bool:
        """Whether linear + GELU pairs run as `linear_gelu` (the compiled blocks' pass)."""
        return self.compiled and self._epilogue_wanted

    def warm_up(self) -> dict[str, tuple[int, ...]]:
        """One small forward at load time: CUDA kernels load and compiled blocks compile
        now, not in the first unit, and a model that cannot run fails before taking work.
        Returns each output's per-row shape (what a unit with no usable row still writes), per
        item for the ragged ones (named in `self.ragged`)."""
        ids = self.tokenizer("pooljobs warm-up: a short text.")["input_ids"]
        out = self.compute(Pack.from_sequences([ids, ids[: max(2, len(ids) // 2)]]).to(self.device))
        self.ragged = frozenset(k for k, v in out.items() if isinstance(v, Ragged))
        return {k: tuple(v.shape[2:] if k in self.ragged else v.shape[1:]) for k, v in out.items()}

    def _prompt(self, name: str | None) -> str:
        name = name or self.pipeline.default_prompt_name
        if name is None:
            return ""
        if name not in self.pipeline.prompts:
            raise ValueError(f"prompt_name={name!r} is not among the model's prompts {sorted(self.pipeline.prompts)}")
        return self.pipeline.prompts[name]

    def _prompt_length(self) -> int:
        """The prompt's tokens at the start of each sequence, as sentence-transformers counts
        them for include_prompt=False (a trailing special token is not the prompt's)."""
        if not self.prompt:
            return 0
        ids = self.tokenizer(self.prompt)["input_ids"]
        return len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)

    def _labels(self) -> list[str] | None:
        if self.options.task == "embed":
            return None
        id2label = getattr(self.state.config, "id2label", None) or {}
        return [str(id2label.get(i, i)) for i in range(self.state.config.num_labels)]

    @property
    def packed(self) -> bool:
        """Whether packs run packed (varlen attention) rather than padded."""
        return self.state.packed

    def token_budget(self) -> int:
        """Tokens per forward: `CPU_TOKEN_BUDGET` on a CPU; on CUDA sized so one layer's
        activations (`HIDDEN_VALUES_PER_TOKEN` x hidden + intermediate values per token)
        use a `FREE_MEMORY_SHARE`th of the free memory."""
        if self.device.type != "cuda":
            return CPU_TOKEN_BUDGET
        free, _ = torch.cuda.mem_get_info(self.device)
        hidden = getattr(self.state.config, "hidden_size", 1024)
        inter = getattr(self.state.config, "intermediate_size", 4 * hidden)
        per_token = (HIDDEN_VALUES_PER_TOKEN * hidden + inter) * torch.finfo(self.dtype).bits // 8
        return int(max(MIN_TOKEN_BUDGET, min(MAX_TOKEN_BUDGET, free // FREE_MEMORY_SHARE // per_token)))

    def fingerprint(self) -> str:
        return fingerprint(self.model_dir)

    def provenance(self) -> dict[str, str]:
        """The settings that determine the output values, as resolved."""
        out = {
            "model": str(self.model_dir), "task": self.options.task, "state": self.state.kind,
            "execution": self.state.execution, "pooling": "+".join(self.pooling), "normalize": str(self.normalize),
            "dim": str(self.options.dim), "dtype": str(self.dtype).removeprefix("torch."),
            "max_length": str(self.max_length), "prompt": self.prompt, "compiled": str(self.compiled),
            "gelu_epilogue": str(self.gelu_epilogue),
        }
        if self.options.task == "embed":
            out["outputs"] = ",".join(self.outputs)
        else:
            out["head"] = self.state.head_reading or "padded: the model's own forward"
        if self.sparse is not None:
            out["sparse"] = json.dumps(self.sparse.settings())
        if self.token_vectors is not None:
            out["multivector"] = json.dumps(self.token_vectors.settings())
        if self.pipeline.sentence_transformers:
            out["modules"] = "+".join(m.kind for m in self.pipeline.modules)
            out["include_prompt"] = str(self.pipeline.include_prompt)
        if self.pipeline.route is not None:
            out["route"] = self.pipeline.route
        if self.ranges is not None:
            out["calibration_ranges"] = json.dumps(np.asarray(self.ranges, np.float32).tolist())
        return out

    def compute(self, pack: Pack) -> dict[str, torch.Tensor | Ragged]:
        """One pack (already on `self.device`) -> the task's outputs, each (B, ...) float32, or a
        `Ragged` per row (sparse, multivector: `states.ragged`), all from one forward."""
        return ragged.resolve(self.launch(pack))

    @torch.inference_mode()
    def launch(self, pack: Pack) -> dict[str, torch.Tensor | Ragged | Pending]:
        """`compute`'s outputs as queued on the device, nothing waited for: those whose width
        the device decides (SPLADE's every positive weight) as a `Pending` under the key
        "sparse" (`ragged.resolve` gives them)."""
        if self.options.task == "embed":
            if self.layer_pooling is not None:
                hidden = self.layer_pooling(self.state.hidden_states(pack, all_layers=True))  # (L+1, T, H) -> (T, H)
            else:
                hidden = self.state.hidden_states(pack)  # (T, H)
            out: dict[str, torch.Tensor | Ragged] = {}
            if "dense" in self.outputs:
                pooled = pool(hidden, pack.cu_seqlens, self.pooling, self.prompt_skip)  # (B, H * modes)
                for module in self.post:
                    pooled = module(pooled)  # (B, D)
                out["embedding"] = finish(pooled, self.normalize, self.options.dim)
            if self.sparse is not None:
                sparse = self.sparse(hidden, pack)
                if isinstance(sparse, Pending):
                    out["sparse"] = sparse
                else:
                    out.update(sparse)
            if self.token_vectors is not None:
                out["multivector"] = self.token_vectors(hidden, pack.input_ids, pack.cu_seqlens, pack.max_len)
            return out
        logits = self.state.logits(pack).float()  # (B, C)
        if self.options.task == "score" and logits.shape[1] == 1:
            return {"score": self.activation(logits)[:, 0], "logits": logits}
        multi = getattr(self.state.config, "problem_type", None) == "multi_label_classification"
        probs = torch.sigmoid(logits) if multi else torch.softmax(logits, dim=1)
        return {"probs": probs, "logits": logits}
