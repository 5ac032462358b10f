"""QuaRot-style rotation of pre-norm RMSNorm models, in pure torch plus the `_C` Walsh–Hadamard kernel. What to
rotate comes from the model's discovered layout (toolkit.models.view): the groups that read the residual stream and
the norm each reads, the groups that write it, the value projection, routers.

1. Fuse each RMSNorm's effective scale (γ, or Gemma's 1 + γ) into the linears (and MoE routers) that read it and
   into lm_head; the norm's effective scale becomes 1.
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
Where the rotation is not exact the run is refused with the reason (`rotation_refusal`): LayerNorm models (GPT-2,
OPT, Phi, Falcon, ...: the mean subtraction does not commute with a rotation), post-norm blocks (Gemma 2/3, OLMo 2,
EXAONE 4: a per-channel norm scale on a branch output before the residual add does not commute either), an
unidentified value projection, fused experts with quantized activations (their inputs live inside one forward).
Fused experts are rotated on both sides (gate/up input, down output) without an online rotation before down.

Device: each weight is rotated where it lives, in float64, by the rotation's own factors (a matmul over m, then a
Walsh–Hadamard over p; no dense n×n Q is formed), the factors moved to the weight's device (a CPU factor against GPU
weights would fail); the online hook rotates activations on their own device and in their own dtype, with the
rotation's small factors cached per (device, dtype).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from toolkit.compress.orthogonal import KRON, CrossHeadRotation, OrthogonalRotation
from toolkit.core.errors import BadInputError

log = logging.getLogger("iclrkit")


V_NAMES = ("v_proj", "value", "v")


def _value(view, index: int):
    """(slot, rows or None) of block `index`'s value projection: a v_proj-like slot, or the value rows of a fused
    q/k/v projection whose row layout the architecture table gives."""
    layout, block = view.layout(index), view.blocks[index]
    attn_in = [g for g in layout.groups if "attn_in" in g.roles]
    for group in attn_in:
        for slot in group.slots:
            if slot.name.rsplit(".", 1)[-1] in V_NAMES:
                return slot, None
    dims = view.dims()
    if view.traits.qkv_layout == "concat" and attn_in and dims["head_dim"]:
        slot = attn_in[0].slots[0]
        q_rows, kv_rows = dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"]
        if slot.shape(block)[0] == q_rows + 2 * kv_rows:
            return slot, (q_rows + kv_rows, q_rows + 2 * kv_rows)
    return None, None


def rotation_refusal(view, a_bits: int = 16) -> str | None:
    """Why the residual rotation would not be exact for this model (None: it is)."""
    if view.embed_tokens is None or view.lm_head is None:
        return "the model has no token embedding or no output head to rotate"
    final = view.final_norm
    if final is None:
        return "no final norm found before the output head"
    from toolkit.models.norms import norm_info

    if norm_info(view.final_norm_path, final).kind != "rmsnorm":
        return "its final norm is a LayerNorm (mean subtraction does not commute with a rotation)"
    dims = view.dims()
    head_dim = dims["head_dim"]
    if not head_dim or head_dim & (head_dim - 1):
        return f"the head dimension {head_dim} is not a power of two (the per-head V/O Hadamard)"
    for index in range(len(view)):
        layout = view.layout(index)
        if layout.post_norms:
            return (f"post-norms {layout.post_norms} scale a branch's output per channel before the residual add, "
                    "which does not commute with the residual rotation")
        for group in layout.groups:
            if group.reads_residual and group.norm is None:
                return f"{group.names[0]} reads the residual stream without a norm in front of it"
        for path in layout.pre_norms:
            if layout.norms[path].kind != "rmsnorm" or layout.norms[path].has_bias:
                return (f"{path} is a LayerNorm: its mean subtraction does not commute with a rotation (the "
                        "SliceGPT/QuaRot mean fold is not implemented)")
        if layout.routers and not any(g.role == "experts_in" for g in layout.groups):
            return f"routers {[r.name for r in layout.routers]} without fused experts"
        if layout.experts is not None and a_bits < 16:
            return "fused experts compute their inputs inside one forward: their activations cannot be quantized"
        if not any("attn_out" in g.roles for g in layout.groups):
            return "no attention output projection found"
        if _value(view, index)[0] is None:
            return "the value projection was not identified (a fused q/k/v of unknown row layout)"
    return None


def _input_side(weight: torch.Tensor, rotate) -> None:
    """W ← W·Q in place; `rotate(x)` computes x·Q along the last dimension (float64)."""
    weight.copy_(rotate(weight.double()).to(weight.dtype))


def _output_side(weight: torch.Tensor, bias, rotate) -> None:
    """W ← Qᵀ·W (and b ← b·Q) in place: Qᵀ·W = (Wᵀ·Q)ᵀ."""
    weight.copy_(rotate(weight.double().t()).t().to(weight.dtype))
    if bias is not None:
        bias.data.copy_(rotate(bias.data.double()).to(bias.dtype))


def _per_head(rotation, head_dim: int):
    """x ↦ x·diag(Q_h, …, Q_h) (the head rotation on every head's slice of the last dimension)."""
    def rotate(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return rotation.apply(x.reshape(*shape[:-1], shape[-1] // head_dim, head_dim)).reshape(shape)
    return rotate


def _fuse_norm(norm: nn.Module, offset: float, weights: list[torch.Tensor]) -> None:
    """Fold the norm's effective scale (offset + γ) into the input columns of `weights`; the norm then scales by 1."""
    gamma = (norm.weight.data.double() + offset)
    for weight in weights:
        weight.copy_((weight.double() * gamma.to(weight.device).unsqueeze(0)).to(weight.dtype))
    norm.weight.data.fill_(1.0 - offset)


def _bias(block: nn.Module, slot):
    return getattr(block.get_submodule(slot.module), "bias", None) if slot.kind == "linear" else None


@torch.no_grad()
def rotate_model(view, seed: int = 0, online_o_proj: bool = False, kind: str = "auto") -> dict:
    """Rotate in place (function unchanged up to float rounding); returns what the packed loader must rebuild,
    with the kind of each rotation under "hadamard" ("exact" | "kron-orthogonal"). `online_o_proj` adds the online
    cross-head Hadamard before o_proj (QuaRot does it for activation quantization: pass a_bits < 16). `kind` is
    every rotation's construction (`OrthogonalRotation`): "auto" (exact where constructed), "exact" (bad input
    where no construction exists) or "kron-orthogonal" (the construction before exact Hadamards)."""
    reason = rotation_refusal(view, a_bits=16 if not online_o_proj else 4)
    if reason is not None:
        raise BadInputError(f"rotation is not exact for {view.model_type}: {reason}", "run with --no-rotate")
    model = view.model
    embed, head = view.embed_tokens, view.lm_head
    if head.weight is embed.weight:
        head.weight = nn.Parameter(embed.weight.data.clone())
    model.config.tie_word_embeddings = False
    text_config = getattr(model.config, "text_config", None)
    if text_config is not None:
        text_config.tie_word_embeddings = False
    dims = view.dims()
    hidden, head_dim, heads = embed.weight.shape[1], dims["head_dim"], dims["heads"]
    residual_rotation = OrthogonalRotation(hidden, seed, kind)
    # every weight is rotated by the rotations' own factors (`apply`: a matmul over m, then a Walsh–Hadamard over
    # p), O(n·(m + log p)) per row instead of a dense n×n product: the same Q up to float64 rounding
    residual = residual_rotation.apply
    head_rotation = OrthogonalRotation(head_dim, seed + 1, kind)
    per_head = _per_head(head_rotation, head_dim)
    downs = [(i, s) for i in range(len(view)) for g in view.layout(i).groups if "mlp_out" in g.roles
             for s in g.slots]
    widths = sorted({s.shape(view.blocks[i])[1] for i, s in downs})
    intermediate = widths[0] if widths else dims["intermediate"]
    online = OrthogonalRotation(intermediate, seed + 2, kind, signs=False)
    cross = CrossHeadRotation(heads, head_dim, seed + 3, kind) if online_o_proj else None
    embed.weight.data = residual(embed.weight.data.double()).to(embed.weight.dtype)
    for index, block in enumerate(view.blocks):
        _rotate_block(view, index, block, residual, per_head, cross, online if len(widths) == 1 else None)
    _fuse_norm(view.final_norm, norm_offset(view, view.final_norm_path), [head.weight.data])
    _input_side(head.weight.data, residual)
    install_online_rotations(view, online if len(widths) == 1 else None, cross)
    kinds = {"residual": residual_rotation.kind, "head": head_rotation.kind}
    record = {"residual_seed": seed, "head_seed": seed + 1, "hidden": hidden, "head_dim": head_dim}
    if len(widths) == 1:
        kinds["down_proj"] = online.kind
        record.update(online_down_proj_seed=seed + 2, intermediate=intermediate)
    if cross is not None:
        kinds["o_proj"] = cross.kind
        record["online_o_proj"] = {"heads": heads, "head_dim": head_dim, "seed": seed + 3}
    record["hadamard"] = kinds
    log.info("rotation: %s", ", ".join(f"{name} {kind}" for name, kind in kinds.items()))
    return record


def norm_offset(view, path: str) -> float:
    from toolkit.models.norms import norm_info

    return norm_info(path, view.model.get_submodule(path)).offset


def _rotate_block(view, index, block, residual, per_head, cross, online) -> None:
    layout = view.layout(index)
    readers: dict[str, list[torch.Tensor]] = {}  # norm path → the weights whose input it scales
    for group in layout.groups:
        if group.reads_residual:
            readers.setdefault(group.norm, []).extend(slot.weight(block) for slot in group.slots)
    experts_norm = next((g.norm for g in layout.groups if g.role == "experts_in"), None)
    for router in layout.routers:  # routers read the MLP's input (the experts' norm)
        readers.setdefault(experts_norm, []).append(router.weight(block))
    for path, weights in readers.items():
        _fuse_norm(block.get_submodule(path), layout.norms[path].offset, weights)
        for weight in weights:
            _input_side(weight, residual)
    for group in layout.groups:
        if group.writes_residual:
            for slot in group.slots:
                _output_side(slot.weight(block), _bias(block, slot), residual)
    value, rows = _value(view, index)
    weight = value.weight(block)
    bias = _bias(block, value)
    if rows is not None:  # the value rows of a fused q/k/v projection
        weight = weight[rows[0]:rows[1]]
        bias = None if bias is None else bias[rows[0]:rows[1]]
    _output_side(weight, bias, per_head)
    for group in layout.groups:
        if "attn_out" in group.roles:
            for slot in group.slots:
                if cross is None:
                    _input_side(slot.weight(block), per_head)
                else:  # the hook feeds x·G, so W_o·R·G restores W_o on the per-head-rotated input
                    _input_side(slot.weight(block), lambda x: cross.apply(per_head(x)))
        if "mlp_out" in group.roles and online is not None:
            for slot in group.slots:
                _input_side(slot.weight(block), online.apply)


def online_rotations(rotation: dict) -> tuple[OrthogonalRotation | None, CrossHeadRotation | None]:
    """The online rotations a `rotate_model` record describes (down_proj's or None, and o_proj's or None). A record
    without "hadamard" predates exact Hadamards: its down_proj rotation is rebuilt kron-orthogonal, as it was made."""
    kinds = rotation.get("hadamard") or {}
    down = None
    if "online_down_proj_seed" in rotation:
        down = OrthogonalRotation(rotation["intermediate"], rotation["online_down_proj_seed"],
                                  kinds.get("down_proj", KRON), signs=False)
    cross = None
    if rotation.get("online_o_proj"):
        spec = rotation["online_o_proj"]
        cross = CrossHeadRotation(spec["heads"], spec["head_dim"], spec["seed"], kinds.get("o_proj", "auto"))
    return down, cross


def _online_targets(view, online, cross) -> list[tuple[nn.Module, object]]:
    targets = []
    for index, block in enumerate(view.blocks):
        for group in view.layout(index).groups:
            for slot in group.slots:
                if slot.kind == "expert":
                    continue
                if "mlp_out" in group.roles and online is not None and slot.shape(block)[1] == online.n:
                    targets.append((block.get_submodule(slot.module), online))
                if "attn_out" in group.roles and cross is not None:
                    targets.append((block.get_submodule(slot.module), cross))
    return targets


def install_online_rotations(view, online: OrthogonalRotation | None,
                             cross: CrossHeadRotation | None = None) -> list:
    """Forward pre-hooks rotating down_proj's input by Q_int (the weights already hold W·Q_int) and, with `cross`,
    o_proj's input by G (its weight holds W_o·R·G)."""
    handles = []
    for module, rotation in _online_targets(view, online, cross):
        module.iclrkit_online_rotation = rotation
        handles.append(module.register_forward_pre_hook(
            lambda mod, args, rotation=rotation: (rotation.apply(args[0]), *args[1:])))
    return handles


def fold_online_rotations(view) -> None:
    """Undo the online rotations for export to a plain HF model: W ← W·Qᵀ (down_proj, o_proj), hooks removed."""
    for module in view.model.modules():
        online = getattr(module, "iclrkit_online_rotation", None)
        if online is None:
            continue
        weight = module.weight.data
        module.weight.data = (weight.double() @ online.matrix(weight.device).t()).to(weight.dtype)
        module._forward_pre_hooks.clear()
        del module.iclrkit_online_rotation
