"""QuaRot-style rotation of RMSNorm (Llama-family) models, in pure torch plus the `_C` Walsh–Hadamard kernel.

1. Fuse each RMSNorm's γ into the linears that read it (q/k/v, gate/up, lm_head); γ becomes 1.
2. Rotate the residual stream by an orthogonal Q: embeddings and every output-side linear get Qᵀ, every input-side
   linear and lm_head get Q. RMSNorm without γ commutes with Q, so the model's function is unchanged.
3. Head-wise Hadamard on V/O: v_proj's output (per head) and o_proj's input cancel inside attention.
4. Online rotation before down_proj: its weight absorbs Q_int and a forward pre-hook rotates its input.

Sizes that are not powers of two (SmolLM2: hidden 576 = 64·9, intermediate 1536 = 512·3; llama-small 672 = 32·21)
use Q = (D·H_p) ⊗ B with p the largest power-of-two factor, D random signs and B a random orthogonal m×m matrix,
applied online as a Hadamard over p and a small matmul over m. It is exactly orthogonal; with m > 1 it mixes less
evenly than a true Hadamard (QuaRot's Had-12/Had-36 tables), which this note records rather than hides.
LayerNorm models (GPT-2, OPT) are refused: their mean subtraction does not commute with a rotation.

Device: Q is built in float64 on the weights' device and each weight is rotated where it lives (a CPU Q against GPU
weights would fail); the online hook rotates activations on their own device and in their own dtype, with the
rotation's small factors cached per (device, dtype).
"""

from __future__ import annotations

import torch
from torch import nn

from toolkit.core.errors import BadInputError
from toolkit.models.adapters import ArchAdapter, first_module, get_layers
from toolkit.ops.hadamard import fwht


def split_power_of_two(n: int) -> tuple[int, int]:
    """n = p·m with p the largest power of two dividing n."""
    p = n & -n
    return p, n // p


class OrthogonalRotation:
    """Q = (D·H_p) ⊗ B, deterministic in (n, seed); `apply(x)` computes x @ Q along the last dimension."""

    def __init__(self, n: int, seed: int):
        self.n = n
        self.seed = seed
        self.p, self.m = split_power_of_two(n)
        generator = torch.Generator().manual_seed(seed)
        self.signs = torch.randint(0, 2, (self.p,), generator=generator).to(torch.float64) * 2 - 1
        if self.m > 1:
            gaussian = torch.randn(self.m, self.m, generator=generator, dtype=torch.float64)
            q, r = torch.linalg.qr(gaussian)
            self.block = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
        else:
            self.block = torch.ones(1, 1, dtype=torch.float64)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def factors(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(block B, signs D as a column) on `device` in `dtype`, made once per (device, dtype)."""
        key = (torch.device(device), dtype)
        if key not in self._cache:
            self._cache[key] = (self.block.to(device=device, dtype=dtype),
                                self.signs.to(device=device, dtype=dtype).unsqueeze(1))
        return self._cache[key]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        block, signs = self.factors(x.device, x.dtype)
        y = x.reshape(*shape[:-1], self.p, self.m)
        if self.m > 1:
            y = y @ block
        y = y * signs
        y = fwht(y.transpose(-1, -2).contiguous()).transpose(-1, -2)
        return y.reshape(shape)

    def matrix(self, device: str | torch.device | None = None) -> torch.Tensor:
        """Q (float64) on `device` (default CPU)."""
        return self.apply(torch.eye(self.n, dtype=torch.float64, device=device))


def check_rotatable(adapter: ArchAdapter) -> None:
    if adapter.norm_kind != "rmsnorm" or adapter.extra_norms or adapter.attn_qkv_fused or not adapter.mlp_gate:
        raise BadInputError(
            f"--rotate supports Llama-family RMSNorm models (llama, mistral, qwen2, qwen3), not {adapter.model_types[0]}",
            "LayerNorm models (GPT-2, OPT) need SliceGPT-style mean handling: run with --no-rotate")


def _input_side(linear: nn.Linear, Q: torch.Tensor) -> None:
    weight = linear.weight.data
    linear.weight.data = (weight.double() @ Q.to(weight.device)).to(weight.dtype)


def _output_side(linear: nn.Linear, Q: torch.Tensor) -> None:
    weight = linear.weight.data
    Q = Q.to(weight.device)
    linear.weight.data = (Q.t() @ weight.double()).to(weight.dtype)
    if linear.bias is not None:
        linear.bias.data = (linear.bias.data.double() @ Q).to(weight.dtype)


def _fuse_norm(norm: nn.Module, linears: list[nn.Linear]) -> None:
    gamma = norm.weight.data.double()
    for linear in linears:
        weight = linear.weight.data
        linear.weight.data = (weight.double() * gamma.to(weight.device).unsqueeze(0)).to(weight.dtype)
    norm.weight.data.fill_(1.0)


def _head_diag(rotation: torch.Tensor, heads: int) -> torch.Tensor:
    return torch.block_diag(*([rotation] * heads))


def rotate_model(model: nn.Module, adapter: ArchAdapter, seed: int = 0) -> dict:
    """Rotate in place (function unchanged up to float rounding); returns what the packed loader must rebuild."""
    check_rotatable(adapter)
    config = model.config
    layers = get_layers(model, adapter)
    embed = first_module(model, adapter.embed_tokens)
    head = model.get_submodule(adapter.lm_head)
    if head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.data.clone())
    config.tie_word_embeddings = False
    hidden = embed.weight.shape[1]
    device = embed.weight.device  # Q is built where the weights live (each linear moves it to its own device)
    residual = OrthogonalRotation(hidden, seed).matrix(device)
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    if head_dim & (head_dim - 1):
        raise BadInputError(f"--rotate needs a power-of-two head dimension, got {head_dim}")
    head_rotation = OrthogonalRotation(head_dim, seed + 1).matrix(device)
    intermediate = layers[0].get_submodule(adapter.mlp_down).weight.shape[1]
    online = OrthogonalRotation(intermediate, seed + 2)
    online_matrix = online.matrix(device)
    embed.weight.data = (embed.weight.data.double() @ residual.to(embed.weight.device)).to(embed.weight.dtype)
    for layer in layers:
        get = layer.get_submodule
        attn_in = [get(p) for p in adapter.attention_inputs()]
        mlp_in = [get(p) for p in adapter.mlp_inputs()]
        _fuse_norm(get(adapter.norm_attn), attn_in)
        _fuse_norm(get(adapter.norm_mlp), mlp_in)
        for linear in attn_in + mlp_in:
            _input_side(linear, residual)
        for path in (adapter.attn_out, adapter.mlp_down):
            _output_side(get(path), residual)
        v, o = get(adapter.attn_v), get(adapter.attn_out)
        _output_side(v, _head_diag(head_rotation, v.weight.shape[0] // head_dim))
        _input_side(o, _head_diag(head_rotation, o.weight.shape[1] // head_dim))
        _input_side(get(adapter.mlp_down), online_matrix)
    final_norm = first_module(model, adapter.final_norm)
    _fuse_norm(final_norm, [head])
    _input_side(head, residual)
    install_online_rotations(model, adapter, online)
    return {"residual_seed": seed, "head_seed": seed + 1, "online_down_proj_seed": seed + 2,
            "hidden": hidden, "intermediate": intermediate, "head_dim": head_dim}


def install_online_rotations(model: nn.Module, adapter: ArchAdapter, online: OrthogonalRotation) -> list:
    """Forward pre-hooks rotating down_proj's input by Q_int (the weights already hold W·Q_int)."""
    handles = []
    for layer in get_layers(model, adapter):
        down = layer.get_submodule(adapter.mlp_down)
        down.iclrkit_online_rotation = online
        handles.append(down.register_forward_pre_hook(lambda mod, args: (online.apply(args[0]), *args[1:])))
    return handles


def fold_online_rotations(model: nn.Module, adapter: ArchAdapter) -> None:
    """Undo the online rotation for export to a plain HF model: W_down ← W_down·Q_intᵀ, hooks removed."""
    for layer in get_layers(model, adapter):
        down = layer.get_submodule(adapter.mlp_down)
        online = getattr(down, "iclrkit_online_rotation", None)
        if online is None:
            continue
        weight = down.weight.data
        down.weight.data = (weight.double() @ online.matrix(weight.device).t()).to(weight.dtype)
        down._forward_pre_hooks.clear()
        del down.iclrkit_online_rotation
