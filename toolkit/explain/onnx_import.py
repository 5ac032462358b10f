"""ONNX import for chain-shaped MLP/CNN classifiers (Gemm/MatMul+Add, Conv, Relu, Flatten/Reshape,
BatchNormalization, AveragePool) into an nn.Sequential that `to_affine_net` understands."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from toolkit.core.errors import BadInputError

PASS_THROUGH = {"Identity", "Dropout", "Constant"}  # Constant: the target shape of a Reshape


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _tensor(initializers: dict, name: str, op: str) -> torch.Tensor:
    if name not in initializers:
        raise BadInputError(f"ONNX {op}: '{name}' is not a constant initializer (only chain networks are supported)")
    return initializers[name]


def _gemm(node, inits) -> nn.Linear:
    attrs = _attrs(node)
    if attrs.get("transA", 0):
        raise BadInputError("ONNX Gemm with transA=1 is not supported")
    weight = _tensor(inits, node.input[1], "Gemm") * attrs.get("alpha", 1.0)
    weight = weight if attrs.get("transB", 0) else weight.T
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    layer.weight.data = weight.clone()
    bias = _tensor(inits, node.input[2], "Gemm") * attrs.get("beta", 1.0) if len(node.input) > 2 else None
    layer.bias.data = bias.clone().reshape(-1) if bias is not None else torch.zeros(weight.shape[0])
    return layer


def _conv(node, inits) -> nn.Conv2d:
    attrs = _attrs(node)
    weight = _tensor(inits, node.input[1], "Conv")
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        raise BadInputError("ONNX Conv with groups or dilation is not supported")
    pads = attrs.get("pads", [0, 0, 0, 0])
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise BadInputError("ONNX Conv with asymmetric padding is not supported")
    layer = nn.Conv2d(weight.shape[1], weight.shape[0], tuple(weight.shape[2:]), stride=tuple(attrs.get("strides", [1, 1])),
                      padding=(pads[0], pads[1]))
    layer.weight.data = weight.clone()
    layer.bias.data = _tensor(inits, node.input[2], "Conv").clone() if len(node.input) > 2 else torch.zeros(weight.shape[0])
    return layer


def _batchnorm(node, inits, rank: int) -> nn.Module:
    scale, shift, mean, var = (_tensor(inits, name, "BatchNormalization") for name in node.input[1:5])
    layer = (nn.BatchNorm2d if rank == 4 else nn.BatchNorm1d)(scale.numel(), eps=_attrs(node).get("epsilon", 1e-5))
    layer.weight.data, layer.bias.data = scale.clone(), shift.clone()
    layer.running_mean.data, layer.running_var.data = mean.clone(), var.clone()
    return layer.eval()


def _avgpool(node) -> nn.AvgPool2d:
    attrs = _attrs(node)
    pads = attrs.get("pads", [0, 0, 0, 0])
    return nn.AvgPool2d(tuple(attrs["kernel_shape"]), stride=tuple(attrs.get("strides", attrs["kernel_shape"])),
                        padding=(pads[0], pads[1]), count_include_pad=bool(attrs.get("count_include_pad", 0)))


def _add_bias(previous: nn.Module | None, bias: torch.Tensor) -> None:
    if not isinstance(previous, (nn.Linear, nn.Conv2d)):
        raise BadInputError("ONNX Add is only supported as the bias of a MatMul or Conv")
    previous.bias.data = previous.bias.data + bias.reshape(-1)


def load_onnx(path: Path) -> tuple[nn.Sequential, tuple[int, ...]]:
    """(nn.Sequential, input shape without the batch axis) of a chain-shaped ONNX classifier."""
    import onnx
    from onnx import numpy_helper

    try:
        graph = onnx.load(str(path)).graph
    except Exception as exc:  # noqa: BLE001 - onnx raises many types for a corrupt file
        raise BadInputError(f"cannot read ONNX file {path}: {type(exc).__name__}") from None
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).float() for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise BadInputError(f"ONNX model {path} must have exactly one non-constant input, has {len(inputs)}")
    dims = [d.dim_value for d in inputs[0].type.tensor_type.shape.dim][1:]
    if not dims or any(d <= 0 for d in dims):
        raise BadInputError(f"ONNX input of {path} needs a fixed shape after the batch axis, got {dims}")
    modules: list[nn.Module] = []
    rank = len(dims) + 1
    for node in graph.node:
        op = node.op_type
        if op == "Gemm":
            modules.append(_gemm(node, inits))
        elif op == "MatMul":
            weight = _tensor(inits, node.input[1], "MatMul").T
            layer = nn.Linear(weight.shape[1], weight.shape[0])
            layer.weight.data, layer.bias.data = weight.clone(), torch.zeros(weight.shape[0])
            modules.append(layer)
        elif op == "Add":
            constant = next((n for n in node.input if n in inits), None)
            if constant is None:
                raise BadInputError("ONNX Add of two computed tensors (residual) is not supported")
            _add_bias(modules[-1] if modules else None, inits[constant])
        elif op == "Conv":
            modules.append(_conv(node, inits))
        elif op == "Relu":
            modules.append(nn.ReLU())
        elif op in ("Flatten", "Reshape"):
            modules.append(nn.Flatten())
            rank = 2
        elif op == "BatchNormalization":
            modules.append(_batchnorm(node, inits, rank))
        elif op == "AveragePool":
            modules.append(_avgpool(node))
        elif op not in PASS_THROUGH:
            raise BadInputError(f"unsupported ONNX op {op}", "supported: Gemm MatMul Add Conv Relu Flatten Reshape "
                                                             "BatchNormalization AveragePool")
    return nn.Sequential(*modules).eval(), tuple(dims)
