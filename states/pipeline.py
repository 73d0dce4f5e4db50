"""What a model directory says to run, read from sentence-transformers' own files (torch-free).

A sentence-transformers export lists its modules in `modules.json`; each module keeps its
settings in its folder, in the format of the version that saved it (v2 .. 6.x: the
Pooling module's `pooling_mode_*_tokens` flags or `pooling_mode`, `word_embedding_dimension`
or `embedding_dimension`, the Transformer's `sentence_*_config.json` with `tokenizer_args`
or `processor_kwargs`). `read_pipeline` turns them into one `Pipeline`:

    Transformer -> [WeightedLayerPooling] -> Pooling -> post-pooling modules   (SentenceTransformer)
    Transformer (fill-mask) -> SpladePooling                                  (SparseEncoder)
    Transformer -> token modules (Dense, Normalize) -> [MultiVectorMask]      (MultiVectorEncoder)

with a `Router` replaced by the route the options choose. A module pooljobs cannot run
(StaticEmbedding, CNN, LSTM, BoW, custom code, ...) is a `ModelLoadError` naming it, never
skipped: a skipped module gives embeddings that look right and are not. A directory
without `modules.json` is a plain transformers model (`Pipeline.sentence_transformers`
is False) and runs with the state's defaults.

Beside the modules, FlagEmbedding's BGE-M3 heads (`M3_HEADS`: `sparse_linear.pt`,
`colbert_linear.pt` in the model directory, found by name) give the sparse and multivector
outputs BGE-M3's semantics (`states.sparse.LexicalWeights`, `states.multivector.ColbertVectors`);
a directory whose modules define the same output as well is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from states.errors import ModelLoadError
from states.options import ST_POOLING_MODES

# Pooling flags of sentence-transformers < 6.3, in the order its forward concatenates them.
_LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# The Transformer's settings file, by the names sentence-transformers has given it.
_TRANSFORMER_CONFIGS = (
    "sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
    "sentence_camembert_config.json", "sentence_albert_config.json", "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
# Modules after pooling that `states.modules` runs, and Dropout (nothing at inference).
POST_POOLING = ("Dense", "LayerNorm", "Normalize", "Dropout")
# Modules on every token's states (their config's module_input_name is token_embeddings).
TOKEN_MODULES = ("Dense", "Normalize")
RUNNABLE = ("Transformer", "MLMTransformer", "Pooling", "WeightedLayerPooling", "Router", "SpladePooling",
            "MultiVectorMask", *POST_POOLING)
# FlagEmbedding's BGE-M3 heads: `torch.save(nn.Linear.state_dict())` files in the model
# directory, by the output kind each serves.
M3_HEADS = {"sparse": "sparse_linear.pt", "multivector": "colbert_linear.pt"}
# Keys of a Transformer's tokenizer kwargs that are loading options, not tokenizer settings.
_LOADING_KEYS = {"trust_remote_code", "revision", "token", "cache_dir", "local_files_only", "subfolder"}


@dataclass(frozen=True)
class ModuleSpec:
    """One sentence-transformers module: its class name, folder and saved settings."""

    kind: str
    path: Path
    config: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Pipeline:
    """What to run, resolved from the model directory's files."""

    root: Path  # the model directory
    transformer_dir: Path  # where the transformers config, weights and tokenizer live
    sentence_transformers: bool = False  # the directory has modules.json
    transformer_task: str = "feature-extraction"  # the Transformer module's task (sequence-classification: a cross-encoder)
    max_seq_length: int | None = None
    do_lower_case: bool = False
    tokenizer_kwargs: dict = field(default_factory=dict)
    output_hidden_states: bool = False  # the Transformer hands every layer's states on
    layer_pooling: ModuleSpec | None = None  # WeightedLayerPooling, before Pooling
    pooling: tuple[str, ...] | None = None  # sentence-transformers' mode names, concatenated in this order
    include_prompt: bool = True
    post: tuple[ModuleSpec, ...] = ()  # after pooling, in order
    route: str | None = None  # the Router route taken, when there is a Router
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    activation: str | None = None  # a cross-encoder's saved activation_fn (a torch.nn class path)
    splade: ModuleSpec | None = None  # SpladePooling over the MLM logits (a SparseEncoder)
    token_post: tuple[ModuleSpec, ...] = ()  # on every token's states, in order (a MultiVectorEncoder's projection)
    multivector_mask: ModuleSpec | None = None  # MultiVectorMask: the skiplist of a MultiVectorEncoder
    m3_sparse: Path | None = None  # BGE-M3's sparse_linear.pt: lexical weights per token
    m3_colbert: Path | None = None  # BGE-M3's colbert_linear.pt: ColBERT vectors per token

    @property
    def modules(self) -> tuple[ModuleSpec, ...]:
        return tuple(m for m in (self.layer_pooling, *self.post) if m is not None)


def read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def _kind(type_ref: str, where: Path) -> str:
    """The class name of a `modules.json` type, for sentence-transformers' own modules
    under any of their module paths (`sentence_transformers.models.Dense`, `...base.modules.dense.Dense`)."""
    name = type_ref.rsplit(".", 1)[-1]
    if not type_ref.startswith("sentence_transformers.") or name not in RUNNABLE:
        raise ModelLoadError(
            f"{where}: module type {type_ref!r} cannot be run by pooljobs (it runs the sentence-transformers "
            f"modules {', '.join(RUNNABLE)}); use sentence-transformers itself for this model"
        )
    return name


def _inside(root: Path, relative: str) -> Path:
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()):
        raise ModelLoadError(f"{root}: module path {relative!r} leaves the model directory")
    return path


def _expand_router(spec: ModuleSpec, route: str | None) -> tuple[list[ModuleSpec], str]:
    """A Router's modules on the chosen route (the option, else the Router's default)."""
    config = read_json(spec.path / "router_config.json")
    structure, types = config.get("structure", {}), config.get("types", {})
    params = config.get("parameters", {})
    default = params.get("default_route") or (next(iter(structure), None) if params.get("allow_empty_key") else None)
    chosen = route or default
    if chosen not in structure:
        raise ModelLoadError(
            f"{spec.path}: the Router needs a route; route={chosen!r} is not one of {sorted(structure)} "
            "(pass route=...)"
        )
    modules = []
    for name in structure[chosen]:
        path = _inside(spec.path, name)
        kind = _kind(types.get(name, "?"), spec.path)
        modules.append(ModuleSpec(kind, path))
    return modules, chosen


def _module_config(spec: ModuleSpec) -> ModuleSpec:
    if spec.kind == "MLMTransformer":  # sentence-transformers' older name of a fill-mask Transformer
        spec = _module_config(ModuleSpec("Transformer", spec.path))
        return ModuleSpec("Transformer", spec.path, {"transformer_task": "fill-mask", **spec.config})
    if spec.kind == "Transformer":
        for name in _TRANSFORMER_CONFIGS:
            if (spec.path / name).exists():
                return ModuleSpec(spec.kind, spec.path, read_json(spec.path / name))
        return spec
    if spec.kind == "Router" or not (spec.path / "config.json").exists():
        return spec
    return ModuleSpec(spec.kind, spec.path, read_json(spec.path / "config.json"))


def pooling_modes(config: dict, where: Path) -> tuple[str, ...]:
    """The Pooling module's modes, from `pooling_mode` (a name or a list) or the older
    flags (no flag set means mean, as sentence-transformers reads it)."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(name for key, name in _LEGACY_POOLING_FLAGS.items() if config.get(key)) or ("mean",)
    for mode in modes:
        if mode not in ST_POOLING_MODES:
            raise ModelLoadError(f"{where}: pooling mode {mode!r} is not one of {ST_POOLING_MODES}")
    return modes


def _st_file(root: Path) -> dict:
    path = root / "config_sentence_transformers.json"
    return read_json(path) if path.exists() else {}


def read_pipeline(model_dir: Path, route: str | None = None) -> Pipeline:
    """The pipeline the directory's files describe (see the module docstring)."""
    st = _st_file(model_dir)
    prompts = dict(st.get("prompts") or {})
    activation = st.get("activation_fn")
    m3 = {kind: model_dir / name if (model_dir / name).is_file() else None for kind, name in M3_HEADS.items()}
    modules_file = model_dir / "modules.json"
    if not modules_file.exists():
        return Pipeline(model_dir, model_dir, prompts=prompts, default_prompt_name=st.get("default_prompt_name"),
                        activation=activation, m3_sparse=m3["sparse"], m3_colbert=m3["multivector"])
    specs, chosen = [], None
    for entry in read_json(modules_file):
        spec = ModuleSpec(_kind(entry.get("type", "?"), modules_file), _inside(model_dir, entry.get("path", "")))
        if spec.kind == "Router":
            routed, chosen = _expand_router(spec, route)
            specs.extend(routed)
        else:
            specs.append(spec)
    if route is not None and chosen is None:
        raise ModelLoadError(f"route={route!r} but {model_dir} has no Router module")
    specs = [_module_config(s) for s in specs]
    kinds = [s.kind for s in specs]
    if kinds[:1] != ["Transformer"] or kinds.count("Transformer") != 1:
        raise ModelLoadError(f"{modules_file}: pooljobs runs one Transformer module first; this pipeline is {kinds}")
    transformer, rest = specs[0], specs[1:]
    layer_pooling = rest.pop(0) if rest[:1] and rest[0].kind == "WeightedLayerPooling" else None
    splade = rest.pop(0) if rest[:1] and rest[0].kind == "SpladePooling" else None
    token_post = []
    while rest and rest[0].kind in TOKEN_MODULES and rest[0].config.get("module_input_name") == "token_embeddings":
        token_post.append(rest.pop(0))
    multivector_mask = rest.pop(0) if rest[:1] and rest[0].kind == "MultiVectorMask" else None
    pooling, include_prompt = None, True
    if rest[:1] and rest[0].kind == "Pooling":
        config = rest.pop(0).config
        pooling, include_prompt = pooling_modes(config, transformer.path), bool(config.get("include_prompt", True))
    misplaced = [s.kind for s in rest if s.kind not in POST_POOLING]
    if misplaced or (rest and pooling is None) or (splade and (token_post or multivector_mask or pooling)):
        raise ModelLoadError(f"{modules_file}: pooljobs cannot run the module order {kinds}")
    if (splade and m3["sparse"]) or ((token_post or multivector_mask) and m3["multivector"]):
        raise ModelLoadError(f"{model_dir}: both sentence-transformers modules ({kinds}) and BGE-M3 head files "
                             f"({', '.join(p.name for p in m3.values() if p)}) define an output; remove one")
    cfg = transformer.config
    tokenizer_kwargs = dict(cfg.get("processor_kwargs") or cfg.get("tokenizer_args") or {})
    config_kwargs = dict(cfg.get("config_kwargs") or cfg.get("config_args") or {})
    model_config = transformer.path / "config.json"
    hidden_states = config_kwargs.get(
        "output_hidden_states", model_config.exists() and bool(read_json(model_config).get("output_hidden_states")))
    return Pipeline(
        root=model_dir, transformer_dir=transformer.path, sentence_transformers=True,
        transformer_task=cfg.get("transformer_task", "feature-extraction"),
        # A MultiVectorEncoder's document_length is its limit for documents (what pooljobs embeds).
        max_seq_length=cfg.get("document_length") or cfg.get("max_seq_length"), do_lower_case=bool(cfg.get("do_lower_case", False)),
        tokenizer_kwargs={k: v for k, v in tokenizer_kwargs.items() if k not in _LOADING_KEYS},
        output_hidden_states=bool(hidden_states), layer_pooling=layer_pooling, pooling=pooling,
        include_prompt=include_prompt, post=tuple(rest), route=chosen, prompts=prompts,
        default_prompt_name=st.get("default_prompt_name"), activation=activation, splade=splade,
        token_post=tuple(token_post), multivector_mask=multivector_mask, m3_sparse=m3["sparse"],
        m3_colbert=m3["multivector"],
    )


def model_limit(pipeline: Pipeline, tokenizer_max: int | None, positions: int | None) -> int:
    """The longest sequence the model takes: sentence-transformers' max_seq_length, else
    the tokenizer's, capped by the usable positions (512 when nothing says)."""
    st_limit = None if "model_max_length" in pipeline.tokenizer_kwargs else pipeline.max_seq_length
    limits = [st_limit] if st_limit else [v for v in (tokenizer_max,) if v and v < 1e6]
    if positions:
        limits.append(positions)
    return min(limits) if limits else 512


def output_size(spec: ModuleSpec, size: int) -> int:
    """The embedding size after `spec`, from its config (no weights read)."""
    if spec.kind == "Dense":
        if int(spec.config.get("in_features", size)) != size:
            raise ModelLoadError(f"{spec.path}: Dense takes {spec.config['in_features']} dimensions, gets {size}")
        return int(spec.config["out_features"])
    return size
