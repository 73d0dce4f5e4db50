"""A loaded model ready for packs: tokenizer, routed state, and resolved task settings.

`load_runtime(options)` is the one place a model is loaded (in a test, in-process, or in
a Ray actor); `Runtime.compute(pack)` turns a pack into the task's output tensors.
"""

from __future__ import annotations

import torch

from states.compiling import GeluEpilogue, compile_blocks
from states.interface import ModelState, Pack
from states.loading import (
    DTYPES, SentenceSettings, Task, check_model_dir, fingerprint, load_model, load_tokenizer, read_sentence_settings,
)
from states.options import COMPILE_CHOICES, Execution, ModelOptions
from states.packed import position_offset
from states.pooling import check_mode, finish, pool
from states.routing import init_model_state


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


def _max_length(settings: SentenceSettings, tokenizer, state: ModelState, requested: int | None) -> int:
    """The longest sequence the model can take: sentence-transformers' setting, else the
    tokenizer's, capped by the position table (less the positions RoBERTa-style
    embeddings reserve, as the packed path offsets them)."""
    limits = [v for v in (settings.max_seq_length, getattr(tokenizer, "model_max_length", None)) if v and v < 1e6]
    positions = getattr(state.config, "max_position_embeddings", None)
    if positions:
        limits.append(positions - position_offset(state.model))
    model_max = min(limits) if limits else 512
    if requested is None:
        return model_max
    if requested > model_max:
        raise ValueError(f"max_length={requested} exceeds what the model takes ({model_max})")
    return requested


def _execution(options: ModelOptions) -> Execution:
    """Classification heads read fixed positions of a padded batch (`ModelState.logits`),
    so only embeddings run packed; the packed attention cannot serve a padded forward."""
    if options.task == "embed":
        return options.execution
    if options.execution == "packed":
        raise ValueError(
            f"execution='packed' is for task='embed'; task={options.task!r} runs padded (use 'auto' or 'padded')"
        )
    return "padded"


class Runtime:
    """Everything a worker needs to turn packs into outputs for one model."""

    def __init__(self, options: ModelOptions) -> None:
        self.options = options
        execution = _execution(options)
        self.model_dir = check_model_dir(options.model, options.allow_pickle)
        self.device = resolve_device(options.device)
        self.dtype = resolve_dtype(options.dtype, self.device)
        self.settings = read_sentence_settings(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir, options.trust_remote_code)
        model = load_model(
            self.model_dir, options.task, self.dtype, self.device,
            trust_remote_code=options.trust_remote_code, allow_pickle=options.allow_pickle,
        )
        self.state: ModelState = init_model_state(model, execution, options.state)
        self.max_length = _max_length(self.settings, self.tokenizer, self.state, options.max_length)
        self.pooling = check_mode(
            (self.settings.pooling or self.state.default_pooling) if options.pooling == "auto" else options.pooling
        )
        self.normalize = self.settings.normalize if options.normalize is None else options.normalize
        self.prompt = self._prompt(options.prompt_name)
        self.labels = self._labels()
        self.compiled = self._compile(options.compile)
        self.output_shapes = self.warm_up()

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
        Returns each output's per-row shape (what a unit with no usable row still writes)."""
        ids = self.tokenizer("pooljobs warm-up: a short text.")["input_ids"]
        out = self.compute(Pack.from_sequences([ids, ids[: max(2, len(ids) // 2)]]).to(self.device))
        return {k: tuple(v.shape[1:]) for k, v in out.items()}

    def _prompt(self, name: str | None) -> str:
        name = name or self.settings.default_prompt_name
        if name is None:
            return ""
        if name not in self.settings.prompts:
            raise ValueError(f"prompt_name={name!r} is not among the model's prompts {sorted(self.settings.prompts)}")
        return self.settings.prompts[name]

    def _labels(self) -> list[str] | None:
        if self.options.task == "embed":
            return None
        id2label = getattr(self.state.config, "id2label", None) or {}
        return [str(id2label.get(i, i)) for i in range(self.state.config.num_labels)]

    def fingerprint(self) -> str:
        return fingerprint(self.model_dir)

    def provenance(self) -> dict[str, str]:
        """The settings that determine the output values, as resolved."""
        return {
            "model": str(self.model_dir), "task": self.options.task, "state": self.state.kind,
            "execution": self.state.execution, "pooling": self.pooling, "normalize": str(self.normalize),
            "dim": str(self.options.dim), "dtype": str(self.dtype).removeprefix("torch."),
            "max_length": str(self.max_length), "prompt": self.prompt, "compiled": str(self.compiled),
            "gelu_epilogue": str(self.gelu_epilogue),
        }

    @torch.inference_mode()
    def compute(self, pack: Pack) -> dict[str, torch.Tensor]:
        """One pack (already on `self.device`) -> the task's outputs, each (B, ...) float32."""
        if self.options.task == "embed":
            hidden = self.state.hidden_states(pack)  # (T, H)
            pooled = pool(hidden, pack.cu_seqlens, self.pooling)  # (B, H)
            return {"embedding": finish(pooled, self.normalize, self.options.dim)}
        logits = self.state.logits(pack).float()  # (B, C)
        if self.options.task == "score" and logits.shape[1] == 1:
            return {"score": torch.sigmoid(logits[:, 0]), "logits": logits}
        multi = getattr(self.state.config, "problem_type", None) == "multi_label_classification"
        probs = torch.sigmoid(logits) if multi else torch.softmax(logits, dim=1)
        return {"probs": probs, "logits": logits}

