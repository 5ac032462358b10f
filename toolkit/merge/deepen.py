"""Depth matching: function-preserving deepening of a model to a target's number of layers (Net2DeeperNet).

Net2Net (Chen et al., ICLR 2016, https://arxiv.org/abs/1511.05641) deepens a network by inserting layers that
compute the identity, so the deeper model computes exactly the same function. The projection (projection.py) calls
this before matching widths, so models of different widths *and* depths map into one target layout. New layers are
appended after the model's last hidden layer (before the head), where the inputs they see are:

- digits MLP: post-ReLU activations (>= 0), so Linear(W = I, b = 0) followed by ReLU is the identity;
- digits CNN: post-ReLU feature maps (>= 0), so a 3x3 Dirac kernel with 'same' padding, bias 0, then ReLU is too;
- GPT-2: the residual stream; a block whose attention and MLP output projections (c_proj weight and bias) are zero
  adds nothing to it (LayerNorm weights 1, biases 0; the unused c_attn / c_fc weights are zero as well).

A model deeper than the target is refused: dropping layers changes the function and is not done silently.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.merge.models import PlainModel

GPT2_BLOCK = re.compile(r"^transformer\.h\.(\d+)\.(.+)$")
GPT2_ONES = ("ln_1.weight", "ln_2.weight")
GPT2_ZEROS = ("ln_1.bias", "ln_2.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
              "attn.c_proj.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")


def depth_of(model: PlainModel) -> int | None:
    """Hidden layers of an MLP, convolutions of a CNN, blocks of a GPT-2; None for families without deepening."""
    if model.family == "digits-mlp":
        return len(model.arch["sizes"]) - 2
    if model.family == "digits-cnn":
        return int(model.arch["depth"])
    if model.family == "hf-gpt2":
        return int(model.arch["n_layer"])
    return None


def match_depth(source: PlainModel, target: PlainModel) -> PlainModel:
    """`source` deepened to `target`'s depth (itself when equal); a deeper source is refused."""
    have, want = depth_of(source), depth_of(target)
    if have is None or have == want:
        return source
    if have > want:
        raise BadInputError(f"{source.source} has {have} layers but the target layout has {want}: the projection "
                            "inserts identity layers but never drops layers; pass the deepest model as --target")
    return deepen(source, want)


def deepen(model: PlainModel, depth: int) -> PlainModel:
    """The same function with `depth` layers (identity layers appended after the last hidden one)."""
    extra = depth - depth_of(model)
    require(extra >= 0, f"cannot deepen a {depth_of(model)}-layer model to {depth} layers")
    if model.family == "digits-mlp":
        state, sizes = deepen_mlp(model.state, model.arch["sizes"], extra)
        return replace(model, state=state, arch={**model.arch, "sizes": sizes})
    if model.family == "digits-cnn":
        state = deepen_cnn(model.state, int(model.arch["depth"]), extra)
        return replace(model, state=state, arch={**model.arch, "depth": depth})
    state = deepen_gpt2(model.state, int(model.arch["n_layer"]), extra)
    arch = {**model.arch, "n_layer": depth}
    if "num_hidden_layers" in arch:
        arch["num_hidden_layers"] = depth
    return replace(model, state=state, arch=arch)


def deepen_mlp(state: dict[str, torch.Tensor], sizes: list[int], extra: int
               ) -> tuple[dict[str, torch.Tensor], list[int]]:
    """`extra` Linear(I, 0) + ReLU layers inserted before the head of a ReLU MLP named layers.<i>.*."""
    hidden = len(sizes) - 2
    require(hidden >= 1, "an MLP without a hidden layer has no ReLU output to insert identity layers after")
    width, head = sizes[-2], state[f"layers.{hidden}.weight"]
    out = {n: t for n, t in state.items() if not n.startswith(f"layers.{hidden}.")}
    for i in range(hidden, hidden + extra):
        out[f"layers.{i}.weight"] = torch.eye(width, dtype=head.dtype)
        out[f"layers.{i}.bias"] = torch.zeros(width, dtype=head.dtype)
    out[f"layers.{hidden + extra}.weight"] = head.clone()
    out[f"layers.{hidden + extra}.bias"] = state[f"layers.{hidden}.bias"].clone()
    return out, sizes[:-1] + [width] * extra + sizes[-1:]


def deepen_cnn(state: dict[str, torch.Tensor], depth: int, extra: int) -> dict[str, torch.Tensor]:
    """`extra` 3x3 Dirac convolutions (bias 0) inserted after the last ReLU convolution, before pooling and head."""
    last = state[f"convs.{depth - 1}.weight"]
    require(last.shape[-2:] == (3, 3), "identity convolutions need the zoo's 3x3 'same' kernels")
    out = {n: t for n, t in state.items() if n.startswith("convs.")}
    for i in range(depth, depth + extra):
        kernel = torch.zeros(last.shape[0], last.shape[0], 3, 3, dtype=last.dtype)
        torch.nn.init.dirac_(kernel)
        out[f"convs.{i}.weight"] = kernel
        out[f"convs.{i}.bias"] = torch.zeros(last.shape[0], dtype=last.dtype)
    out.update({n: t for n, t in state.items() if not n.startswith("convs.")})
    return out


def deepen_gpt2(state: dict[str, torch.Tensor], n_layer: int, extra: int) -> dict[str, torch.Tensor]:
    """`extra` residual-identity blocks appended after the last block (zero output projections)."""
    template = {m.group(2): t for n, t in state.items() if (m := GPT2_BLOCK.match(n)) and m.group(1) == "0"}
    unknown = sorted(set(template) - set(GPT2_ONES) - set(GPT2_ZEROS))
    require(not unknown, f"GPT-2 deepening does not know the block tensors {unknown[:3]}")
    new = {f"transformer.h.{i}.{name}": (torch.ones_like(t) if name in GPT2_ONES else torch.zeros_like(t))
           for i in range(n_layer, n_layer + extra) for name, t in template.items()}
    return {**state, **new}  # callers order tensors by the target's layout
