"""sentence-transformers' modules around pooling, as torch modules on the device.

Each class computes what its sentence-transformers namesake's `forward` does (Dense:
`activation(linear(x))` plus the optional residual; LayerNorm; Normalize; Dropout, which
does nothing at inference; WeightedLayerPooling over the layers' hidden states) and
loads the weights sentence-transformers saved in the module's folder under the same
parameter names, strictly: a missing or extra tensor is a `ModelLoadError`. Activations
are instantiated only from `torch.nn` classes named in the config, never imported from
an arbitrary path. `load_linear` reads the `nn.Linear` heads FlagEmbedding saves beside a
BGE-M3 model.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from states.errors import ModelLoadError
from states.pipeline import ModuleSpec


def activation(path: str | None) -> nn.Module:
    """The `torch.nn` module class a config names (`torch.nn.modules.activation.Tanh`),
    instantiated; None is the identity."""
    if path is None:
        return nn.Identity()
    cls = getattr(nn, path.rsplit(".", 1)[-1], None)
    if not path.startswith("torch.") or not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelLoadError(f"activation function {path!r} is not a torch.nn module class pooljobs can create")
    return cls()


def _check_io(config: dict, kind: str) -> None:
    """A module maps sentence embeddings to sentence embeddings, or every token's states to
    token states (a MultiVectorEncoder's projection); the pipeline places it by that name."""
    source = config.get("module_input_name") or "sentence_embedding"
    if (config.get("module_output_name") or source) != source or source not in ("sentence_embedding", "token_embeddings"):
        raise ModelLoadError(f"{kind} reads {config.get('module_input_name')!r} and writes "
                             f"{config.get('module_output_name')!r}; pooljobs runs it on sentence embeddings or "
                             "on token embeddings, in place")


class Dense(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.in_features, self.out_features = int(config["in_features"]), int(config["out_features"])
        _check_io(config, "Dense")
        self.linear = nn.Linear(self.in_features, self.out_features, bias=bool(config.get("bias", True)))
        # sentence-transformers' default when the config names none is Tanh.
        self.activation_function = activation(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
        self.use_residual = bool(config.get("use_residual", False))
        if self.use_residual and self.in_features != self.out_features:
            self.residual = nn.Linear(self.in_features, self.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, in) -> (B, out)
        out = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (x if self.in_features == self.out_features else self.residual(x))
        return out


class LayerNorm(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(int(config["dimension"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class Normalize(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        _check_io(config, "Normalize")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)


class Dropout(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class WeightedLayerPooling(nn.Module):
    """Every token's states as a weighted mean of the layers from `layer_start` on."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.layer_start = int(config.get("layer_start", 4))
        layers = int(config.get("num_hidden_layers", 12))
        self.layer_weights = nn.Parameter(torch.ones(layers + 1 - self.layer_start))

    def forward(self, layers: torch.Tensor) -> torch.Tensor:  # (L+1, T, H) -> (T, H)
        w = self.layer_weights.float()
        return (layers[self.layer_start :].float() * w[:, None, None]).sum(0) / w.sum()


_CLASSES: dict[str, type[nn.Module]] = {
    "Dense": Dense, "LayerNorm": LayerNorm, "Normalize": Normalize, "Dropout": Dropout,
    "WeightedLayerPooling": WeightedLayerPooling,
}


def _load_weights(module: nn.Module, spec: ModuleSpec, allow_pickle: bool) -> None:
    expected = module.state_dict()
    if not expected:
        return
    safe, pickle = spec.path / "model.safetensors", spec.path / "pytorch_model.bin"
    if safe.exists():
        from safetensors.torch import load_file

        weights = load_file(safe)
    elif pickle.exists() and allow_pickle:
        weights = torch.load(pickle, map_location="cpu", weights_only=True)
    elif pickle.exists():
        raise ModelLoadError(f"{pickle} is a pickle, which can run code when loaded; convert it to safetensors, "
                             "or pass --allow-pickle if you trust the source")
    else:
        raise ModelLoadError(f"{spec.path}: the {spec.kind} module has no weights (model.safetensors)")
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(f"{spec.path}: the {spec.kind} module's weights do not fit its config "
                             f"(missing {missing}, unexpected {unexpected})")
    try:
        module.load_state_dict(weights)
    except RuntimeError as e:  # a shape that disagrees with the config
        raise ModelLoadError(f"{spec.path}: the {spec.kind} module's weights do not fit its config: {e}") from e


def build(spec: ModuleSpec, allow_pickle: bool = False) -> nn.Module:
    """The module `spec` describes, with its saved weights, in float32 on the CPU."""
    try:
        module = _CLASSES[spec.kind](spec.config)
    except KeyError as e:
        raise ModelLoadError(f"{spec.path}: the {spec.kind} module's config lacks {e}") from e
    _load_weights(module, spec, allow_pickle)
    return module.eval()


def load_linear(path: Path, in_features: int, out_features: int | None = None) -> nn.Linear:
    """The `nn.Linear` a `torch.save(linear.state_dict())` file holds (FlagEmbedding's BGE-M3
    heads), in float32 on the CPU. Read with `torch.load(weights_only=True)`, whose unpickler
    builds tensors and plain containers only and never runs code from the file, so these
    files need no --allow-pickle. Anything but a `weight` (out, in_features) with a `bias`
    (out,), out being `out_features` when given, is a ModelLoadError naming the file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
        raise ModelLoadError(f"{path} is not a state dict that torch.load(weights_only=True) reads "
                             f"({type(e).__name__}); it should be torch.save(nn.Linear(...).state_dict())") from e
    if not (isinstance(state, dict) and set(state) == {"weight", "bias"} and all(map(torch.is_tensor, state.values()))):
        held = list(state) if isinstance(state, dict) else type(state).__name__
        raise ModelLoadError(f"{path} holds {held}; an nn.Linear state dict (weight, bias) was expected")
    weight, bias = state["weight"], state["bias"]
    out = out_features or (weight.shape[0] if weight.ndim else 0)
    if tuple(weight.shape) != (out, in_features) or tuple(bias.shape) != (out,):
        raise ModelLoadError(f"{path}: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} do not make an "
                             f"nn.Linear from the model's hidden size {in_features} to {out or 'any size'}")
    linear = nn.Linear(in_features, weight.shape[0])
    linear.load_state_dict({"weight": weight.float(), "bias": bias.float()})
    return linear.eval()
