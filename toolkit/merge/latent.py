"""LS-Merge: merging models in the latent space of a weight VAE (`iclrkit merge latent train | run`).

Paper: "LS-Merge: Merging Language Models in Latent Space", ICLR 2026, https://openreview.net/forum?id=VSDV0SWwOC
(project page ls-merge.github.io). Official code (VAE training only): https://github.com/sorobedio/ls-merge.
Pipeline: project every model into one layout (projection.py) -> layer-aware chunks (chunking.py) -> encode with
the two-stage weight VAE (vae.py) -> interpolate the posterior means -> decode -> reassemble the state dict.
Tensors the paper keeps out of the VAE (names containing bias / norm / ln) are averaged in weight space; the merged
model's metadata says so.

Residual correction (`residual`, ours, not in the paper): the decoder's error on each parent is known exactly,
r_i = W_i - decode(encode(W_i)), so the merge returns decode(z_merge) + Σ_i λ_i r_i. This equals the weight-space
average of the (projected) parents plus the latent term decode(z_merge) - Σ_i λ_i decode(z_i): what interpolating in
the latent space changes relative to interpolating the weights, with the VAE's reconstruction loss removed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError, RunError, require
from toolkit.core.records import write_json
from toolkit.merge import chunking
from toolkit.merge.baselines import normalise_weights
from toolkit.merge.common import (
    finish,
    load_parents,
    merge_states,
    nonnegative_weights,
    per_model,
    pick_target,
    record_depths,
)
from toolkit.merge.config import AverageConfig, LatentMergeConfig, LatentTrainConfig
from toolkit.merge.evaluate import evaluate
from toolkit.merge.models import PlainModel, load_for_merge, parse_model_list
from toolkit.merge.projection import lay_out
from toolkit.merge.vae import LossWeights, VAEShape, WeightVAE, stage_loss, stage_parameters
from toolkit.nn.schedule import warmup_cosine
from toolkit.nn.train import fit

PAPER = "https://openreview.net/forum?id=VSDV0SWwOC"
VAE_WEIGHTS, VAE_META, CKPT = "vae.safetensors", "vae.json", "vae_train.pt"


# ------------------------------------------------------------------ data
def laid_out(model: PlainModel, target: PlainModel | None, align: bool, fill: str = "zero") -> dict[str, torch.Tensor]:
    """The model in the target's layout (its own when no target, or when it is the target)."""
    if target is None or model is target:
        return model.state
    return lay_out(model, target, align, fill)


def batch_of(chunked: chunking.Chunked, window: int) -> dict[str, torch.Tensor]:
    return chunking.windows(chunked, window)


def concat(batches: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def select(data: dict, index: torch.Tensor, device: str) -> dict[str, torch.Tensor]:
    return {k: v[index].to(device) for k, v in data.items()}


# ------------------------------------------------------------------ VAE files
def save_vae(model: WeightVAE, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / VAE_WEIGHTS))
    write_json(out / VAE_META, meta)


def load_vae(path: str, device: str) -> tuple[WeightVAE, dict]:
    from safetensors.torch import load_file

    root = Path(path)
    require((root / VAE_META).is_file() and (root / VAE_WEIGHTS).is_file(),
            f"{path} is not a VAE directory (expected {VAE_META} and {VAE_WEIGHTS})",
            hint="train one with `iclrkit merge latent train`")
    try:
        meta = json.loads((root / VAE_META).read_text())
        model = WeightVAE(VAEShape(**meta["shape"]))
        model.load_state_dict(load_file(str(root / VAE_WEIGHTS)))
    except (json.JSONDecodeError, KeyError, TypeError, RuntimeError) as exc:
        raise BadInputError(f"{path}: unreadable VAE ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None
    return model.to(device).eval(), meta


def check_layout(chunked: chunking.Chunked, meta: dict, source: str) -> None:
    signature = chunked.signature()
    if signature not in meta["signatures"]:
        shapes = ", ".join(f"{n}{tuple(s)}" for n, s in signature[:3])
        raise BadInputError(f"the VAE was trained for other shapes than {source} ({shapes}, ...)",
                            hint="train a VAE on models of this layout, or pass --target to project into one")


# ------------------------------------------------------------------ train
def run_train(config: LatentTrainConfig, ctx) -> None:
    parents = load_parents(config.models, ctx.device, depths_may_differ=True)
    held = [load_for_merge(spec, ctx.device) for spec in parse_model_list(config.holdout)] if config.holdout else []
    target = pick_target(parents, config.target, ctx.device) if config.target else None
    sizes = {tuple(tuple(t.shape) for t in p.state.values()) for p in parents}
    require(target is not None or len(sizes) == 1, "the models differ in size: pass --target to choose the layout "
            "every model is projected into")
    if target is not None:
        record_depths(ctx, parents, target)
    encoded = [chunking.chunk_state(laid_out(p, target, config.align, config.fill), config.chunk, config.exclude)
               for p in parents]
    held_encoded = [chunking.chunk_state(laid_out(p, target, config.align, config.fill), config.chunk,
                                         config.exclude) for p in held]
    top_layer = max(int(c.layer_ids.max()) for c in encoded)
    require(top_layer < config.max_layers, f"models have {top_layer + 1} layers > max_layers={config.max_layers}")
    shape = VAEShape(chunk=config.chunk, window=config.window, d_model=config.d_model, heads=config.heads,
                     encoder_layers=config.encoder_layers, decoder_layers=config.decoder_layers,
                     latent_dim=config.latent_dim, compression=config.compression, max_layers=config.max_layers)
    try:
        model = WeightVAE(shape).to(ctx.device)
    except ValueError as exc:
        raise BadInputError(str(exc)) from None
    data = concat([batch_of(c, config.window) for c in encoded])
    weights = LossWeights(config.recon_weight, config.mmd_weight, config.kl_weight, config.distill_weight)
    state = _resume_state(ctx)
    if state:
        model.load_state_dict(state["model"])
    recon = dict(state["recon"]) if state else {}
    stages = [(stage, steps) for stage, steps in ((1, config.stage1_steps), (2, config.stage2_steps)) if steps]
    for stage, steps in stages:
        if state and state["stage"] > stage:
            continue
        _train_stage(model, data, stage, steps, config, weights, ctx, state if state and state["stage"] == stage
                     else None, recon)
        recon[f"stage{stage}"] = reconstruction_report(model, parents, encoded, stage, ctx.device)
        if held:
            recon[f"stage{stage}_holdout"] = reconstruction_report(model, held, held_encoded, stage, ctx.device)
        _checkpoint(ctx, stage + 1, 0, model, None, recon)
    ctx.metrics["vae_recon_rel_err"] = {k: v["rel_err"] for k, v in recon.items()}
    ctx.metrics["reconstruction"] = recon
    ctx.metrics["n_models"], ctx.metrics["n_windows"] = len(parents), int(data["x"].shape[0])
    meta = {"shape": shape.as_dict(), "exclude": config.exclude, "signatures": _unique([c.signature() for c in encoded]),
            "target": target.source if target else None, "align": config.align, "fill": config.fill, "family": parents[0].family,
            "stages": [stage for stage, _ in stages], "recon": ctx.metrics["vae_recon_rel_err"], "paper": PAPER}
    save_vae(model.cpu(), ctx.out, meta)
    ctx.path(VAE_WEIGHTS), ctx.path(VAE_META)


def _unique(signatures: list[list]) -> list[list]:
    seen, out = set(), []
    for signature in signatures:
        key = json.dumps(signature)
        if key not in seen:
            seen.add(key)
            out.append(signature)
    return out


def _resume_state(ctx) -> dict | None:
    path = ctx.checkpoint_dir / CKPT
    if ctx.resume and path.is_file():
        from toolkit.core.errors import reading_checkpoint

        with reading_checkpoint(path):
            return torch.load(path, weights_only=True)
    return None


def _checkpoint(ctx, stage: int, step: int, model: WeightVAE, optimizer, recon: dict,
                generator: torch.Generator | None = None) -> None:
    """Where to continue: (stage, step); a finished stage is saved as (stage + 1, 0) with no optimiser state. The
    batch generator's and torch's RNG states (the VAE's sampling) make a resumed stage bit-identical."""
    torch.save({"stage": stage, "step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None, "recon": recon,
                "generator": generator.get_state() if generator is not None else None,
                "torch_rng": torch.get_rng_state()}, ctx.checkpoint_dir / CKPT)


def _train_stage(model: WeightVAE, data: dict, stage: int, steps: int, config: LatentTrainConfig,
                 weights: LossWeights, ctx, state: dict | None, recon: dict) -> None:
    params = stage_parameters(model, stage)
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.99), weight_decay=0.0)
    start = 0
    if state and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    generator = torch.Generator().manual_seed(ctx.seed * 1000 + stage + start)
    if state and state.get("torch_rng") is not None:  # checkpoints written before it: the old, inexact resume
        torch.set_rng_state(state["torch_rng"])
    if state and state.get("generator") is not None:
        generator.set_state(state["generator"])
    n = data["x"].shape[0]
    warmup = min(config.warmup_steps, max(1, steps // 4))

    def batches():
        for step in ctx.progress(range(start, steps), total=steps - start, description=f"VAE stage {stage}"):
            yield step, select(data, torch.randint(0, n, (min(config.batch_size, n),), generator=generator),
                               ctx.device)

    def loss_of(item):
        step, batch = item
        loss, _ = stage_loss(model, batch, stage, weights)
        if not math.isfinite(loss.item()):
            raise RunError(f"VAE stage {stage} loss became non-finite at step {step}", hint="lower --set lr=...")
        return loss

    def after(step: int, _loss, _record) -> None:
        if (step + 1) % config.checkpoint_every == 0 and step + 1 < steps:
            _checkpoint(ctx, stage, step + 1, model, optimizer, recon, generator)

    model.train()
    fit(optimizer, batches(), loss_of, start=start, clip=(params, config.gradient_clip), on_step=after,
        lr_at=lambda step: warmup_cosine(step, steps, warmup, peak=config.lr))
    model.eval()


# ------------------------------------------------------------------ encode / decode
@torch.no_grad()
def encode(model: WeightVAE, chunked: chunking.Chunked, stage: int, device: str) -> torch.Tensor:
    batch = {k: v.to(device) for k, v in batch_of(chunked, model.shape.window).items()}
    return model.encode(batch, stage)


@torch.no_grad()
def decode(model: WeightVAE, code: torch.Tensor, like_chunked: chunking.Chunked, means: torch.Tensor,
           stds: torch.Tensor, stage: int, device: str) -> dict[str, torch.Tensor]:
    batch = {k: v.to(device) for k, v in batch_of(like_chunked, model.shape.window).items()}
    tokens = chunking.from_windows(model.decode_code(code.to(device), batch, stage), like_chunked.tokens.shape[0])
    return chunking.unchunk(tokens.cpu(), like_chunked.slots, means, stds)


def reconstruction_report(model: WeightVAE, parents: list[PlainModel], encoded: list[chunking.Chunked], stage: int,
                          device: str) -> dict:
    """Relative L2 error of decode(encode(θ)) over the encoded tensors (pooled), and digits accuracy drop."""
    model.eval()
    err_sq = ref_sq = 0.0
    drops = []
    for parent, chunked in zip(parents, encoded):
        decoded = decode(model, encode(model, chunked, stage, device), chunked, chunked.means, chunked.stds, stage,
                         device)
        original = chunking.unchunk(chunked.tokens, chunked.slots, chunked.means, chunked.stds)
        for name, tensor in original.items():
            err_sq += float((decoded[name].double() - tensor.double()).pow(2).sum())
            ref_sq += float(tensor.double().pow(2).sum())
        if parent.family.startswith("digits-") and all(parent.state[n].shape == t.shape for n, t in original.items()):
            rebuilt = PlainModel(parent.family, parent.arch, {**parent.state, **decoded})
            drops.append(evaluate(parent, None, None)["acc_union"] - evaluate(rebuilt, None, None)["acc_union"])
    report = {"rel_err": math.sqrt(err_sq / max(ref_sq, 1e-30))}
    if drops:
        report["mean_acc_drop"] = sum(drops) / len(drops)
    return report


def slerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation per window (flattened), falling back to linear for nearly parallel codes."""
    fa, fb = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    cos = (nn_normalize(fa) * nn_normalize(fb)).sum(-1).clamp(-1.0, 1.0)
    omega = torch.arccos(cos)
    sin = torch.sin(omega)
    linear = sin.abs() < 1e-6
    wa = torch.where(linear, 1 - t, torch.sin((1 - t) * omega) / torch.where(linear, 1.0, sin))
    wb = torch.where(linear, torch.full_like(sin, t), torch.sin(t * omega) / torch.where(linear, 1.0, sin))
    return (wa.unsqueeze(1) * fa + wb.unsqueeze(1) * fb).view_as(a)


def nn_normalize(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def interpolate(codes: list[torch.Tensor], weights: list[float], how: str) -> torch.Tensor:
    if how == "slerp":
        require(len(codes) == 2, "slerp interpolation merges exactly two models")
        return slerp(codes[0], codes[1], weights[1])
    return sum(w * c for w, c in zip(weights, codes))


# ------------------------------------------------------------------ merge
def residual_corrected(merged: dict[str, torch.Tensor], originals: list[dict[str, torch.Tensor]],
                       reconstructions: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """decode(z_merge) + Σ λ_i (W_i - decode(z_i)), summed as Σ λ_i W_i + (decode(z_merge) - Σ λ_i decode(z_i)) so that
    a model merged with itself, or λ = (1, 0, ...), comes back bit-exact."""
    out = {}
    for name, tensor in merged.items():
        average_weights = sum(w * o[name] for w, o in zip(weights, originals))
        average_decoded = sum(w * r[name] for w, r in zip(weights, reconstructions))
        out[name] = average_weights + (tensor - average_decoded)
    return out


def latent_merge(model: WeightVAE, states: list[dict[str, torch.Tensor]], weights: list[float], chunk: int,
                 exclude: list[str], stage: int, interpolation: str, residual: bool, device: str,
                 check=None) -> tuple[dict[str, torch.Tensor], int]:
    """Merge same-layout state dicts through the VAE: (merged state dict, code size per model).

    Tensors the VAE does not encode are averaged in weight space; `check(index, chunked)` may reject a layout."""
    encoded = [chunking.chunk_state(s, chunk, exclude) for s in states]
    for index, chunked in enumerate(encoded):
        if check is not None:
            check(index, chunked)
    codes = [encode(model, c, stage, device) for c in encoded]
    means = sum(w * c.means for w, c in zip(weights, encoded))
    stds = sum(w * c.stds for w, c in zip(weights, encoded))
    decoded = decode(model, interpolate(codes, weights, interpolation), encoded[0], means, stds, stage, device)
    if residual:
        reconstructions = [decode(model, z, c, c.means, c.stds, stage, device) for z, c in zip(codes, encoded)]
        decoded = residual_corrected(decoded, states, reconstructions, weights)
    outside = merge_states(AverageConfig(weights=weights), [{n: s[n] for n in s if n not in decoded}
                                                           for s in states], None) \
        if len(decoded) < len(states[0]) else {}
    return {n: decoded[n] if n in decoded else outside[n] for n in states[0]}, int(codes[0].numel())


def run_merge(config: LatentMergeConfig, ctx) -> None:
    model, meta = load_vae(config.vae, ctx.device)
    parents = load_parents(config.models, ctx.device, depths_may_differ=True)
    require(parents[0].family == meta["family"],
            f"the VAE was trained on {meta['family']} models, not {parents[0].family}")
    per_model(config.weights, len(parents), "merge weights")
    nonnegative_weights(config.weights)
    weights = normalise_weights(config.weights, len(parents))
    target_spec = config.target or meta.get("target")
    target = pick_target(parents, target_spec, ctx.device) if target_spec else pick_target(parents, None, ctx.device)
    align = meta["align"] if config.align is None else config.align
    stage = 2 if config.code == "compact" else 1
    if stage not in meta["stages"]:
        raise BadInputError(f"the VAE has no stage-{stage} code", hint="use --set code=full")
    states = [laid_out(p, target, align, meta.get("fill", "zero")) for p in parents]
    state, code_size = latent_merge(model, states, weights, meta["shape"]["chunk"], meta["exclude"], stage,
                                    config.interpolation, config.residual, ctx.device,
                                    check=lambda i, chunked: check_layout(chunked, meta, parents[i].source))
    finish(ctx, parents, target, state, "merge.latent", PAPER,
           {"vae": str(config.vae), "weights": weights, "interpolation": config.interpolation, "code": config.code,
            "align": align, "fill": meta.get("fill", "zero"), "target": target.source, "residual": config.residual,
            "weight_space_average": sorted(n for n, t in states[0].items()
                                           if not (t.is_floating_point() and chunking.is_encoded(n, meta["exclude"])))})
    ctx.metrics["code_size_per_model"] = code_size
    record_depths(ctx, parents, target)
