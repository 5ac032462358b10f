"""`iclrkit remove-ln analyze`: direct logit attribution (DLA) per component, and CE.

The residual stream before ln_f is exactly embed + pos + Σ_i (attn_i + mlp_i) (per head: Σ_h z_h W_O^h + b_O).
DLA maps each component through ln_f and the unembedding with ONE fixed scale s (the mean token std at ln_f):
  DLA_c = ((c − mean c) · γ/s) W_U,   constant = β W_U (+ head bias).
On an LN-free model ln_f is that affine map, so Σ DLA + constant equals the logits exactly; on an original GPT-2 each
token's own std replaces s, and the sum misses the logits by the (reported) error.
"""

from __future__ import annotations

import torch
from torch import nn

from toolkit.core.errors import BadInputError
from toolkit.core.records import write_json
from toolkit.remove_ln.config import AnalyzeConfig


def load_any(spec: str, device: str):
    """(model, tokenizer) for a folded export dir, or any GPT-2 that load_model understands."""
    from toolkit.models.source import load_model, load_tokenizer, resolve_model_path
    from toolkit.remove_ln.export import is_folded_dir, load_folded
    from toolkit.remove_ln.fakeln import check_supported

    if not spec.startswith("zoo:") and is_folded_dir(resolve_model_path(spec)):
        return load_folded(resolve_model_path(spec), device), load_tokenizer(spec)
    model, tokenizer = load_model(spec, device, torch.float32)
    check_supported(model)
    return model, tokenizer


@torch.no_grad()
def decompose(model, ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """({component: (B, T, d) residual contribution}, final residual (B, T, d), logits (B, T, V))."""
    transformer = model.transformer
    positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    parts: dict[str, torch.Tensor] = {"embed": transformer.wte(ids), "pos_embed": transformer.wpe(positions)
                                      .expand(ids.shape[0], -1, -1)}
    captured: dict[str, torch.Tensor] = {}
    hooks = []
    for index, block in enumerate(transformer.h):
        hooks.append(block.attn.c_proj.register_forward_hook(_keep(captured, f"L{index}.z", "input")))
        hooks.append(block.mlp.register_forward_hook(_keep(captured, f"L{index}.mlp", "output")))
        hooks.append(block.register_forward_hook(_keep(captured, f"L{index}.resid_post", "output")))
    try:
        logits = model(input_ids=ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    n_head = model.config.n_head
    for index, block in enumerate(transformer.h):
        z = captured[f"L{index}.z"]
        w_o, b_o = block.attn.c_proj.weight, block.attn.c_proj.bias  # Conv1D: (d, d), heads along rows
        head_dim = z.shape[-1] // n_head
        for head in range(n_head):
            cols = slice(head * head_dim, (head + 1) * head_dim)
            parts[f"L{index}.H{head}"] = z[..., cols] @ w_o[cols]
        parts[f"L{index}.attn_bias"] = b_o.expand_as(z)
        parts[f"L{index}.mlp"] = captured[f"L{index}.mlp"]
    return parts, captured[f"L{len(transformer.h) - 1}.resid_post"], logits


def _keep(store: dict, name: str, what: str):
    def hook(module, args, output):
        value = args[0] if what == "input" else output
        store[name] = value[0] if isinstance(value, tuple) else value
    return hook


def final_map(model, resid: torch.Tensor):
    """(linear map residual -> logits, constant logits, fixed scale s) for the model's ln_f + unembedding."""
    norm, head = model.transformer.ln_f, model.lm_head
    w_u = head.weight
    constant = head.bias if getattr(head, "bias", None) is not None else torch.zeros(w_u.shape[0], device=w_u.device)
    if not isinstance(norm, nn.LayerNorm):  # folded export: identity norm, folded head
        return (lambda c: c @ w_u.t()), constant, 1.0
    centered = resid - resid.mean(-1, keepdim=True)
    scale = torch.sqrt(centered.pow(2).mean(-1) + norm.eps).mean()
    gamma = norm.weight / scale

    def linear(c: torch.Tensor) -> torch.Tensor:
        return ((c - c.mean(-1, keepdim=True)) * gamma) @ w_u.t()
    return linear, constant + norm.bias @ w_u.t(), scale.item()


@torch.no_grad()
def direct_logit_attribution(model, ids: torch.Tensor) -> dict:
    """{max_abs_err, scale, per_component mean DLA on the correct next token} for the windows `ids` (B, T)."""
    parts, resid, logits = decompose(model, ids)
    linear, constant, scale = final_map(model, resid)
    targets = ids[:, 1:]
    total = constant.expand_as(logits).clone()
    per_component = {}
    for name, part in parts.items():
        contribution = linear(part)
        total += contribution
        per_component[name] = contribution[:, :-1].gather(-1, targets.unsqueeze(-1)).mean().item()
    return {"max_abs_err": (total - logits).abs().max().item(), "max_abs_logit": logits.abs().max().item(),
            "scale": scale, "per_component": per_component}


def run_analyze(config: AnalyzeConfig, ctx) -> dict:
    from toolkit.data.text import load_text, split_text, tokenize
    from toolkit.remove_ln.train import window_ce

    if config.windows < 1 or config.top < 1 or (config.eval_windows is not None and config.eval_windows < 1):
        raise BadInputError("windows, eval_windows and top must be >= 1")
    model, tokenizer = load_any(config.model, ctx.device)
    seqlen = config.seqlen or min(128, model.config.n_positions)
    if not 2 <= seqlen <= model.config.n_positions:
        raise BadInputError(f"seqlen must be in [2, {model.config.n_positions}], got {seqlen}")
    text = load_text(config.data)
    if config.data is None:
        text = split_text(text, test_fraction=0.05, seed=0)[1]
    ids = tokenize(tokenizer, text)
    count = min(config.windows, (ids.numel() - 1) // seqlen)
    if count < 1:
        raise BadInputError(f"text has {ids.numel()} tokens, fewer than one window of {seqlen}")
    windows = ids[:count * seqlen].view(count, seqlen).to(ctx.device)
    ctx.inputs.update(model=config.model, reference=config.reference)
    result = direct_logit_attribution(model, windows)
    ctx.metrics.update(ce=window_ce(model, ids, seqlen, config.eval_windows, ctx.device),
                       dla_max_abs_err=result["max_abs_err"], dla_scale=result["scale"],
                       max_abs_logit=result["max_abs_logit"])
    ranked = sorted(result["per_component"].items(), key=lambda kv: -abs(kv[1]))
    ctx.metrics["top_components"] = {name: value for name, value in ranked[:config.top]}
    report = {"model": config.model, "dla": result}
    if config.reference:
        reference, _ = load_any(config.reference, ctx.device)
        ref = direct_logit_attribution(reference, windows)
        ctx.baselines.update(ce=window_ce(reference, ids, seqlen, config.eval_windows, ctx.device),
                             dla_max_abs_err=ref["max_abs_err"])
        report["reference"] = {"model": config.reference, "dla": ref}
    if ctx.out is not None:

        write_json(ctx.path("dla.json"), report)
    return ctx.metrics
