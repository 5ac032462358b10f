"""Small image classifiers for formal explanations: load (safetensors + JSON spec, ONNX, zoo:NAME), save, and
flatten into an `AffineNet` — alternating dense affine maps and ReLUs — that the bound propagation works on.

Every supported affine module (Linear, Conv2d, BatchNorm in eval mode, AvgPool2d, Flatten) becomes one dense
matrix by probing it with the identity basis; consecutive affine maps are merged. That keeps CROWN simple and
exact for the small networks formal explanation is run on; the dense size guard says when a network is too big.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from toolkit.core.errors import BadInputError

SPEC_FORMAT = "iclrkit-seqnet"
MAX_DENSE_ENTRIES = 60_000_000  # ~480 MB in float64: beyond this, dense CROWN is the wrong tool
AFFINE_MODULES = (nn.Linear, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool2d, nn.Flatten, nn.Identity,
                  nn.Dropout)


@dataclass
class AffineNet:
    """f(x) = W_L relu(... relu(W_1 x + b_1) ...) + b_L on flattened inputs, in float64.

    `input_shape` is (C, H, W) or (n,); a feature is one pixel (all its channels move together)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor]
    input_shape: tuple[int, ...]

    @property
    def n_inputs(self) -> int:
        return self.weights[0].shape[1]

    @property
    def n_classes(self) -> int:
        return self.weights[-1].shape[0]

    @property
    def n_features(self) -> int:
        return self.n_inputs // self.channels

    @property
    def channels(self) -> int:
        return self.input_shape[0] if len(self.input_shape) == 3 else 1

    def feature_of_input(self) -> torch.Tensor:
        """Index of the pixel each flattened (C, H, W) input coordinate belongs to."""
        return torch.arange(self.n_inputs) % self.n_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of flattened inputs (..., n)."""
        h = x
        for k, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            h = h @ weight.T + bias
            if k < len(self.weights) - 1:
                h = torch.relu(h)
        return h

    __call__ = forward


def affine_of(module: nn.Module, in_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """(W, b, out_shape) of an affine module, probing it with the identity basis: W = m(I) - m(0)."""
    n_in = int(torch.tensor(in_shape).prod())
    with torch.no_grad():
        zero = module(torch.zeros(1, *in_shape, dtype=torch.float64))
        out_shape = tuple(zero.shape[1:])
        n_out = zero[0].numel()
        if n_in * n_out > MAX_DENSE_ENTRIES:
            raise BadInputError(f"layer {type(module).__name__} {in_shape}->{out_shape} is too large for dense "
                                "bound propagation", "formal explanation here targets small networks")
        basis = torch.eye(n_in, dtype=torch.float64).reshape(n_in, *in_shape)
        probe = module(basis).reshape(n_in, n_out)
    bias = zero.reshape(-1)
    return (probe - bias).T.contiguous(), bias, out_shape


def to_affine_net(model: nn.Module, input_shape: tuple[int, ...]) -> AffineNet:
    """Flatten a Sequential of supported layers into an AffineNet (affine maps merged across non-ReLU layers)."""
    layers = list(model) if isinstance(model, nn.Sequential) else [model]
    model = model.double().eval()
    weights, biases = [], []
    shape = tuple(input_shape)
    current = None  # the affine map accumulated since the last ReLU
    for layer in layers:
        if isinstance(layer, nn.ReLU):
            if current is None:
                raise BadInputError("a ReLU must follow an affine layer (two ReLUs in a row or a leading ReLU)")
            weights.append(current[0])
            biases.append(current[1])
            current = None
        elif isinstance(layer, AFFINE_MODULES):
            weight, bias, shape = affine_of(layer, shape)
            current = (weight, bias) if current is None else (weight @ current[0], weight @ current[1] + bias)
        else:
            raise BadInputError(f"unsupported layer {type(layer).__name__}",
                                "supported: Linear, Conv2d, ReLU, Flatten, BatchNorm (eval), AvgPool2d")
    if current is None:
        raise BadInputError("the network must end with an affine layer (the logits)")
    weights.append(current[0])
    biases.append(current[1])
    return AffineNet(weights, biases, tuple(input_shape))


# ------------------------------------------------------------------ JSON spec <-> nn.Sequential
def build_sequential(layers: list[dict]) -> nn.Sequential:
    """nn.Sequential from the JSON layer list, e.g. {"type": "conv2d", "in": 1, "out": 8, "kernel": 3, ...}."""
    makers = {
        "linear": lambda d: nn.Linear(d["in"], d["out"]),
        "conv2d": lambda d: nn.Conv2d(d["in"], d["out"], d["kernel"], stride=d.get("stride", 1),
                                      padding=d.get("padding", 0)),
        "relu": lambda d: nn.ReLU(),
        "flatten": lambda d: nn.Flatten(),
        "batchnorm1d": lambda d: nn.BatchNorm1d(d["features"]),
        "batchnorm2d": lambda d: nn.BatchNorm2d(d["features"]),
        "avgpool2d": lambda d: nn.AvgPool2d(d["kernel"], stride=d.get("stride"), padding=d.get("padding", 0)),
    }
    modules = []
    for index, item in enumerate(layers):
        kind = str(item.get("type", "")).lower() if isinstance(item, dict) else ""
        if kind not in makers:
            raise BadInputError(f"layer {index}: unknown type {item!r}", f"known: {', '.join(makers)}")
        try:
            modules.append(makers[kind](item))
        except KeyError as missing:
            raise BadInputError(f"layer {index} ({kind}) misses the field {missing}") from None
    return nn.Sequential(*modules)


def save_net(model: nn.Sequential, layers: list[dict], input_shape: tuple[int, ...], out: Path,
             metadata: dict | None = None) -> None:
    """Write `model.safetensors` + `config.json` (format, input shape, layer list, metadata)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().float().contiguous() for k, v in model.state_dict().items()},
              str(out / "model.safetensors"))
    spec = {"format": SPEC_FORMAT, "input_shape": list(input_shape), "layers": layers, **(metadata or {})}
    (out / "config.json").write_text(json.dumps(spec, indent=2))


def read_spec(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise BadInputError(f"{folder} has no config.json", "expected a folder written by save_net or a .onnx file")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BadInputError(f"malformed JSON in {path}: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT:
        raise BadInputError(f"{path} is not an iclrkit network spec (format must be '{SPEC_FORMAT}')")
    for key in ("input_shape", "layers"):
        if key not in spec:
            raise BadInputError(f"{path} misses '{key}'")
    return spec


def load_sequential(folder: Path) -> tuple[nn.Sequential, dict]:
    from safetensors.torch import load_file

    spec = read_spec(folder)
    model = build_sequential(spec["layers"])
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise BadInputError(f"{folder} has no model.safetensors")
    try:
        model.load_state_dict(load_file(str(weights)))
    except RuntimeError as exc:
        raise BadInputError(f"weights in {weights} do not match the layers in config.json: "
                            f"{str(exc).splitlines()[0]}") from None
    return model.eval(), spec


def load_net(spec: str) -> tuple[AffineNet, dict]:
    """AffineNet + metadata from a folder (config.json + model.safetensors), a .onnx file or zoo:NAME."""
    if spec.startswith("zoo:"):
        from toolkit.zoo.registry import ensure_built

        folder = ensure_built(spec[4:])
    else:
        folder = Path(spec)
        if not folder.exists():
            raise BadInputError(f"model not found: {spec}")
        if folder.is_file():
            if folder.suffix.lower() != ".onnx":
                raise BadInputError(f"model file {spec} is not .onnx", "pass a .onnx file or a saved folder")
            from toolkit.explain.onnx_import import load_onnx

            model, input_shape = load_onnx(folder)
            return to_affine_net(model, input_shape), {"source": str(folder)}
    model, meta = load_sequential(folder)
    net = to_affine_net(model, tuple(meta["input_shape"]))
    for weight in net.weights:
        if not torch.isfinite(weight).all():
            raise BadInputError(f"model {spec} has non-finite weights")
    return net, meta
