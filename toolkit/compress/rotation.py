"""QuaRot-style rotation of RMSNorm (Llama-family) models, in pure torch plus the `_C` Walsh–Hadamard kernel.

1. Fuse each RMSNorm's γ into the linears that read it (q/k/v, gate/up, lm_head); γ becomes 1.
2. Rotate the residual stream by an orthogonal Q: embeddings and every output-side linear get Qᵀ, every input-side
   linear and lm_head get Q. RMSNorm without γ commutes with Q, so the model's function is unchanged.
3. Head-wise Hadamard on V/O: v_proj's output (per head) and o_proj's input cancel inside attention.
4. Online rotation before down_proj: its weight absorbs Q_int and a forward pre-hook rotates its input.

5. With activation quantization (`online_o_proj`, a_bits < 16): an online Hadamard across heads before o_proj
   (QuaRot's `online_partial_had`); o_proj's weight absorbs it, so with the per-head V/O rotation its input sees a
   full Hadamard over heads × head_dim.

Every rotation is an exact Hadamard where one is constructed for its width (`toolkit.ops.hadamard.hadamard_split`:
n = 2^k·m, m = 1 or a Paley order, e.g. SmolLM2's 576 = 16·36 and 1536 = 128·12): the residual Q = D·H_n/√n with
random signs D (QuaRot's random Hadamard), the online ones plain H_n/√n, applied as a matmul over m and a Walsh–
Hadamard over 2^k. Widths without a construction (odd head counts such as SmolLM2's 9) fall back to
Q = (D·H_p) ⊗ B with p the largest power-of-two factor and B a random orthogonal m×m matrix ("kron-orthogonal"):
exactly orthogonal, but it mixes less evenly than a Hadamard. Which one each rotation got is returned (and recorded
in run.json metrics["hadamard"]). Packed files written before exact Hadamards carry no such record and are
rebuilt with the kron-orthogonal construction they were made with.
LayerNorm models (GPT-2, OPT) are refused: their mean subtraction does not commute with a rotation.

Device: each weight is rotated where it lives, in float64, by the rotation's own factors (a matmul over m, then a
Walsh–Hadamard over p; no dense n×n Q is formed), the factors moved to the weight's device (a CPU factor against GPU
weights would fail); the online hook rotates activations on their own device and in their own dtype, with the
rotation's small factors cached per (device, dtype).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from toolkit.core.errors import BadInputError
from toolkit.models.adapters import ArchAdapter, first_module, get_layers
from toolkit.ops.hadamard import fwht, hadamard_split, paley_hadamard

log = logging.getLogger("iclrkit")


def split_power_of_two(n: int) -> tuple[int, int]:
    """n = p·m with p the largest power of two dividing n."""
    p = n & -n
    return p, n // p


EXACT, KRON = "exact", "kron-orthogonal"


class OrthogonalRotation:
    """An orthogonal Q of order n, deterministic in (n, seed, kind, signs); `apply(x)` computes x @ Q along the last
    dimension as a matmul over m then a Walsh–Hadamard over p (n = p·m).

    kind "exact": Q = D·(H_p ⊗ H_m)/√n, a true Hadamard (H_m from Paley), D random signs over all n (identity with
    signs=False: then Q = H_n/√n). kind "kron-orthogonal": Q = (D·H_p) ⊗ B, B random orthogonal (the only kind
    before exact Hadamards; `signs` is ignored, as it always drew its signs). kind "auto": exact where
    `hadamard_split(n)` finds a construction, else kron-orthogonal."""

    def __init__(self, n: int, seed: int, kind: str = "auto", signs: bool = True):
        if kind not in ("auto", EXACT, KRON):
            raise BadInputError(f"unknown rotation kind {kind!r}")
        split = hadamard_split(n) if kind != KRON else None
        if kind == EXACT and split is None:
            raise BadInputError(f"no exact Hadamard of order {n}")
        self.n, self.seed = n, seed
        self.kind = EXACT if split is not None else KRON
        generator = torch.Generator().manual_seed(seed)
        self.pre_signs = None  # [n] (exact kind): x·D before the Hadamard
        self.post_signs = None  # [p] (kron-orthogonal kind): signs over p after the block
        if self.kind == EXACT:
            self.p, self.m = split
            block = torch.ones(1, 1, dtype=torch.int64) if self.m == 1 else torch.from_numpy(paley_hadamard(self.m))
            self.block = block.to(torch.float64) / float(self.m) ** 0.5
            if signs:
                self.pre_signs = torch.randint(0, 2, (n,), generator=generator).to(torch.float64) * 2 - 1
        else:
            self.p, self.m = split_power_of_two(n)
            self.post_signs = torch.randint(0, 2, (self.p,), generator=generator).to(torch.float64) * 2 - 1
            if self.m > 1:
                gaussian = torch.randn(self.m, self.m, generator=generator, dtype=torch.float64)
                q, r = torch.linalg.qr(gaussian)
                self.block = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
            else:
                self.block = torch.ones(1, 1, dtype=torch.float64)
        self._cache: dict[tuple[torch.device, torch.dtype], tuple] = {}

    def factors(self, device: torch.device, dtype: torch.dtype) -> tuple:
        """(block B, signs over n or None, signs over p as a column or None) on `device` in `dtype`, made once per
        (device, dtype)."""
        key = (torch.device(device), dtype)
        if key not in self._cache:
            def put(t):
                return None if t is None else t.to(device=device, dtype=dtype)

            post = put(self.post_signs)
            self._cache[key] = (put(self.block), put(self.pre_signs), None if post is None else post.unsqueeze(1))
        return self._cache[key]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        block, pre, post = self.factors(x.device, x.dtype)
        if pre is not None:
            x = x * pre
        y = x.reshape(*shape[:-1], self.p, self.m)
        if self.m > 1:
            y = y @ block
        if post is not None:
            y = y * post
        if self.p > 1:
            y = fwht(y.transpose(-1, -2).contiguous()).transpose(-1, -2)
        return y.reshape(shape)

    def matrix(self, device: str | torch.device | None = None) -> torch.Tensor:
        """Q (float64) on `device` (default CPU)."""
        return self.apply(torch.eye(self.n, dtype=torch.float64, device=device))


class CrossHeadRotation:
    """The online rotation before o_proj: G = R_heads ⊗ I_head_dim (QuaRot's `online_partial_had`), R_heads the
    plain Hadamard over the head index (exact where one exists, else kron-orthogonal); `apply(x)` = x @ G."""

    def __init__(self, heads: int, head_dim: int, seed: int, kind: str = "auto"):
        self.heads, self.head_dim, self.n = heads, head_dim, heads * head_dim
        self.inner = OrthogonalRotation(heads, seed, kind, signs=False)
        self.kind = self.inner.kind

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = x.reshape(*shape[:-1], self.heads, self.head_dim).transpose(-1, -2)
        return self.inner.apply(y).transpose(-1, -2).reshape(shape)

    def matrix(self, device: str | torch.device | None = None) -> torch.Tensor:
        return self.apply(torch.eye(self.n, dtype=torch.float64, device=device))


def check_rotatable(adapter: ArchAdapter) -> None:
    if adapter.norm_kind != "rmsnorm" or adapter.extra_norms or adapter.attn_qkv_fused or not adapter.mlp_gate:
        raise BadInputError(
            f"--rotate supports Llama-family RMSNorm models (llama, mistral, qwen2, qwen3), not {adapter.model_types[0]}",
            "LayerNorm models (GPT-2, OPT) need SliceGPT-style mean handling: run with --no-rotate")


def _input_side(linear: nn.Linear, rotate) -> None:
    """W ← W·Q; `rotate(x)` computes x·Q along the last dimension (float64)."""
    weight = linear.weight.data
    linear.weight.data = rotate(weight.double()).to(weight.dtype)


def _output_side(linear: nn.Linear, rotate) -> None:
    """W ← Qᵀ·W (and b ← b·Q): Qᵀ·W = (Wᵀ·Q)ᵀ."""
    weight = linear.weight.data
    linear.weight.data = rotate(weight.double().t()).t().contiguous().to(weight.dtype)
    if linear.bias is not None:
        linear.bias.data = rotate(linear.bias.data.double()).to(weight.dtype)


def _per_head(rotation, head_dim: int):
    """x ↦ x·diag(Q_h, …, Q_h) (the head rotation on every head's slice of the last dimension)."""
    def rotate(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return rotation.apply(x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim)).reshape(shape)
    return rotate


def _fuse_norm(norm: nn.Module, linears: list[nn.Linear]) -> None:
    gamma = norm.weight.data.double()
    for linear in linears:
        weight = linear.weight.data
        linear.weight.data = (weight.double() * gamma.to(weight.device).unsqueeze(0)).to(weight.dtype)
    norm.weight.data.fill_(1.0)


def rotate_model(model: nn.Module, adapter: ArchAdapter, seed: int = 0, online_o_proj: bool = False,
                 kind: str = "auto") -> dict:
    """Rotate in place (function unchanged up to float rounding); returns what the packed loader must rebuild,
    with the kind of each rotation under "hadamard" ("exact" | "kron-orthogonal"). `online_o_proj` adds the online
    cross-head Hadamard before o_proj (QuaRot does it for activation quantization: pass a_bits < 16). `kind` is
    every rotation's construction (`OrthogonalRotation`): "auto" (exact where constructed), "exact" (bad input
    where no construction exists) or "kron-orthogonal" (the construction before exact Hadamards)."""
    check_rotatable(adapter)
    config = model.config
    layers = get_layers(model, adapter)
    embed = first_module(model, adapter.embed_tokens)
    head = model.get_submodule(adapter.lm_head)
    if head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.data.clone())
    config.tie_word_embeddings = False
    hidden = embed.weight.shape[1]
    residual_rotation = OrthogonalRotation(hidden, seed, kind)
    # every weight is rotated by the rotations' own factors (`apply`: a matmul over m, then a Walsh–Hadamard over
    # p), O(n·(m + log p)) per row instead of a dense n×n product: the same Q up to float64 rounding
    residual = residual_rotation.apply
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    if head_dim & (head_dim - 1):
        raise BadInputError(f"--rotate needs a power-of-two head dimension, got {head_dim}")
    head_rotation = OrthogonalRotation(head_dim, seed + 1, kind)
    per_head = _per_head(head_rotation, head_dim)
    intermediate = layers[0].get_submodule(adapter.mlp_down).weight.shape[1]
    online = OrthogonalRotation(intermediate, seed + 2, kind, signs=False)
    heads = layers[0].get_submodule(adapter.attn_out).weight.shape[1] // head_dim
    cross = CrossHeadRotation(heads, head_dim, seed + 3, kind) if online_o_proj else None
    embed.weight.data = residual(embed.weight.data.double()).to(embed.weight.dtype)
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
        _output_side(v, per_head)
        if cross is None:
            _input_side(o, per_head)
        else:  # the hook feeds x·G, so W_o·R·G restores W_o on the per-head-rotated input
            _input_side(o, lambda x: cross.apply(per_head(x)))
        _input_side(get(adapter.mlp_down), online.apply)
    final_norm = first_module(model, adapter.final_norm)
    _fuse_norm(final_norm, [head])
    _input_side(head, residual)
    install_online_rotations(model, adapter, online, cross)
    kinds = {"residual": residual_rotation.kind, "head": head_rotation.kind, "down_proj": online.kind}
    record = {"residual_seed": seed, "head_seed": seed + 1, "online_down_proj_seed": seed + 2,
              "hidden": hidden, "intermediate": intermediate, "head_dim": head_dim}
    if cross is not None:
        kinds["o_proj"] = cross.kind
        record["online_o_proj"] = {"heads": heads, "head_dim": head_dim, "seed": seed + 3}
    record["hadamard"] = kinds
    log.info("rotation: %s", ", ".join(f"{name} {kind}" for name, kind in kinds.items()))
    return record


def online_rotations(rotation: dict) -> tuple[OrthogonalRotation, CrossHeadRotation | None]:
    """The online rotations a `rotate_model` record describes (down_proj's, and o_proj's or None). A record without
    "hadamard" predates exact Hadamards: its down_proj rotation is rebuilt kron-orthogonal, as it was made."""
    kinds = rotation.get("hadamard") or {}
    down = OrthogonalRotation(rotation["intermediate"], rotation["online_down_proj_seed"],
                              kinds.get("down_proj", KRON), signs=False)
    cross = None
    if rotation.get("online_o_proj"):
        spec = rotation["online_o_proj"]
        cross = CrossHeadRotation(spec["heads"], spec["head_dim"], spec["seed"], kinds.get("o_proj", "auto"))
    return down, cross


def install_online_rotations(model: nn.Module, adapter: ArchAdapter, online: OrthogonalRotation,
                             cross: CrossHeadRotation | None = None) -> list:
    """Forward pre-hooks rotating down_proj's input by Q_int (the weights already hold W·Q_int) and, with `cross`,
    o_proj's input by G (its weight holds W_o·R·G)."""
    handles = []
    for layer in get_layers(model, adapter):
        targets = [(adapter.mlp_down, online)] + ([(adapter.attn_out, cross)] if cross is not None else [])
        for path, rotation in targets:
            module = layer.get_submodule(path)
            module.iclrkit_online_rotation = rotation
            handles.append(module.register_forward_pre_hook(
                lambda mod, args, rotation=rotation: (rotation.apply(args[0]), *args[1:])))
    return handles


def fold_online_rotations(model: nn.Module, adapter: ArchAdapter) -> None:
    """Undo the online rotations for export to a plain HF model: W ← W·Qᵀ (down_proj, o_proj), hooks removed."""
    for layer in get_layers(model, adapter):
        for path in (adapter.mlp_down, adapter.attn_out):
            module = layer.get_submodule(path)
            online = getattr(module, "iclrkit_online_rotation", None)
            if online is None:
                continue
            weight = module.weight.data
            module.weight.data = (weight.double() @ online.matrix(weight.device).t()).to(weight.dtype)
            module._forward_pre_hooks.clear()
            del module.iclrkit_online_rotation
