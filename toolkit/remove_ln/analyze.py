"""`iclrkit remove-ln analyze`: direct logit attribution (DLA) per component, and CE.

The residual stream before ln_f is exactly embed + pos + Σ_i (attn_i + mlp_i) (per head: Σ_h z_h W_O^h + b_O).
DLA maps each component through ln_f and the unembedding with ONE fixed scale s (the mean token std at ln_f):
  DLA_c = ((c − mean c) · γ/s) W_U,   constant = β W_U (+ head bias).
On an LN-free model ln_f is that affine map, so Σ DLA + constant equals the logits exactly; on an original GPT-2 each
token's own std replaces s, and the sum misses the logits by the (reported) error.

Since s multiplies every component alike, DirectLogits maps each component through γ and W_U as it arrives and divides
by s at the end; with --set onload=true (an HF GPT-2 in safetensors files: the plain export or an original) the DLA
and CE windows run block by block, one block in memory (`analyze_onloaded`, toolkit/nn/onload_stats.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from toolkit.core.errors import BadInputError, RunError
from toolkit.core.records import write_json
from toolkit.remove_ln.config import AnalyzeConfig

CE_BATCH = 16  # windows per forward of the CE (remove_ln.train.window_ce's batch)


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


class DirectLogits:
    """DLA accumulated one component at a time. ln_f's fixed scale s multiplies every component alike, so each one
    is mapped through γ as it arrives (its mean DLA on the correct next token, before 1/s, and a running sum of the
    mapped components, one (B, T, d) tensor); s, and with it the logits, are known once the last block has run."""

    def __init__(self, model, ids: torch.Tensor):
        self.norm, self.head = model.transformer.ln_f, model.lm_head
        self.layer_norm = isinstance(self.norm, nn.LayerNorm)  # a folded export has an identity norm, folded head
        self.rows = self.head.weight[ids[:, 1:]]  # (B, T-1, d): the unembedding rows of the correct next tokens
        self.per_component: dict[str, float] = {}
        self.mapped_sum: torch.Tensor | None = None
        transformer = model.transformer
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        self.add("embed", transformer.wte(ids))
        self.add("pos_embed", transformer.wpe(positions).expand(ids.shape[0], -1, -1))

    def add(self, name: str, part: torch.Tensor) -> None:
        mapped = (part - part.mean(-1, keepdim=True)) * self.norm.weight if self.layer_norm else part
        self.per_component[name] = (mapped[:, :-1] * self.rows).sum(-1).mean().item()
        self.mapped_sum = mapped if self.mapped_sum is None else self.mapped_sum + mapped

    def add_block(self, index: int, block, captured: dict, n_head: int) -> None:
        """Block `index`'s components: each head's z_h W_O^h, the attention output bias and the MLP output."""
        z = captured["z"]
        w_o, b_o = block.attn.c_proj.weight, block.attn.c_proj.bias  # Conv1D: (d, d), heads along rows
        head_dim = z.shape[-1] // n_head
        for head in range(n_head):
            cols = slice(head * head_dim, (head + 1) * head_dim)
            self.add(f"L{index}.H{head}", z[..., cols] @ w_o[cols])
        self.add(f"L{index}.attn_bias", b_o.expand_as(z))
        self.add(f"L{index}.mlp", captured["mlp"])

    def finish(self, resid: torch.Tensor, logits: torch.Tensor) -> dict:
        """{max_abs_err, max_abs_logit, scale, per_component} given the final residual (B, T, d) and the logits."""
        w_u = self.head.weight
        bias = getattr(self.head, "bias", None)
        constant = bias if bias is not None else torch.zeros(w_u.shape[0], device=w_u.device)
        scale = torch.tensor(1.0, device=w_u.device)
        if self.layer_norm:
            centered = resid - resid.mean(-1, keepdim=True)
            scale = torch.sqrt(centered.pow(2).mean(-1) + self.norm.eps).mean()
            constant = constant + self.norm.bias @ w_u.t()
        total = constant + (self.mapped_sum / scale) @ w_u.t()
        s = scale.item()
        return {"max_abs_err": (total - logits).abs().max().item(), "max_abs_logit": logits.abs().max().item(),
                "scale": s, "per_component": {name: value / s for name, value in self.per_component.items()}}


def _component_hooks(block, store: dict, when=None) -> list:
    """Hooks recording the block's attention z (c_proj input) and MLP output into `store` (when `when()` holds)."""
    def keep(name: str, what: str):
        def hook(module, args, output):
            if when is None or when():
                value = args[0] if what == "input" else output
                store[name] = value[0] if isinstance(value, tuple) else value
        return hook
    return [block.attn.c_proj.register_forward_hook(keep("z", "input")),
            block.mlp.register_forward_hook(keep("mlp", "output")),
            block.register_forward_hook(keep("resid", "output"))]


@torch.no_grad()
def direct_logit_attribution(model, ids: torch.Tensor) -> dict:
    """{max_abs_err, scale, per_component mean DLA on the correct next token} for the windows `ids` (B, T)."""
    blocks = model.transformer.h
    dla = DirectLogits(model, ids)
    captured: dict[int, dict] = {index: {} for index in range(len(blocks))}
    hooks = [h for index, block in enumerate(blocks) for h in _component_hooks(block, captured[index])]
    try:
        logits = model(input_ids=ids).logits
    finally:
        for hook in hooks:
            hook.remove()
    for index, block in enumerate(blocks):
        dla.add_block(index, block, captured[index], model.config.n_head)
    return dla.finish(captured[len(blocks) - 1]["resid"], logits)


@torch.no_grad()
def analyze_onloaded(lazy, windows: torch.Tensor, ce_windows: torch.Tensor, device: str = "cpu", progress=None,
                     probe=None) -> tuple[dict, float]:
    """(direct_logit_attribution of `windows`, window CE of `ce_windows`) of a GPT-2 `LazyModel` in one pass over
    its blocks, one block in memory (toolkit/nn/onload_stats.py): the DLA windows run as one batch with the
    component hooks on, the CE windows CE_BATCH at a time; ln_f and the head finish both after the last block."""
    from toolkit.nn.onload_stats import BlockStream

    stream = BlockStream(lazy, device, probe)
    groups = [stream.windows(windows, batch=len(windows)), stream.windows(ce_windows, batch=CE_BATCH)]
    model = lazy.model
    dla = DirectLogits(model, windows.to(device))
    store: dict = {}

    def hooks(index, block):
        return _component_hooks(block, store, when=lambda: stream.group == 0)

    def after(index, _):
        dla.add_block(index, lazy.layers[index], store, model.config.n_head)
        store.clear()

    stream.run(groups, hooks=hooks, after=after, progress=progress)

    def logits(hidden):
        return model.lm_head(model.transformer.ln_f(hidden.to(device)))

    resid = groups[0].hidden[0].to(device)
    result = dla.finish(resid, logits(resid))
    total, tokens = 0.0, 0
    for hidden, chunk in zip(groups[1].hidden, ce_windows.split(CE_BATCH)):
        chunk = chunk.to(device)
        scores = logits(hidden)[:, :-1].float()
        total += torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]), chunk[:, 1:].reshape(-1),
                                                   reduction="sum").item()
        tokens += chunk[:, 1:].numel()
    ce = total / tokens
    if not math.isfinite(ce):
        raise RunError("cross-entropy is not finite: the model produced NaN/Inf logits")
    return result, ce


def ce_windows(ids: torch.Tensor, seqlen: int, max_windows: int | None) -> torch.Tensor:
    """The windows `remove_ln.train.window_ce` scores: non-overlapping, at most max_windows."""
    count = (ids.numel() - 1) // seqlen
    if count < 1:
        raise BadInputError(f"evaluation text has {ids.numel()} tokens, fewer than one window of {seqlen}")
    count = min(count, max_windows or count)
    return ids[:count * seqlen].view(count, seqlen)


def onload_source(spec: str):
    """The safetensors directory onload=true reads: an HF GPT-2 checkpoint (the plain export or an original); the
    folded export has its own loader and is refused, as is anything not in safetensors files."""
    from toolkit.models.lazy import onload_source as model_source
    from toolkit.models.source import resolve_model_path
    from toolkit.remove_ln.export import is_folded_dir

    if not spec.startswith("zoo:") and is_folded_dir(resolve_model_path(spec)):
        raise BadInputError(f"onload=true reads HF GPT-2 checkpoints; {spec} is a folded export, which loads whole",
                            "analyze the plain export with onload=true, or drop onload=true")
    return model_source(spec)


def open_onloaded(spec: str):
    """(LazyModel, tokenizer) of a GPT-2 for onload=true."""
    from toolkit.models.lazy import LazyModel
    from toolkit.models.source import load_tokenizer
    from toolkit.remove_ln.fakeln import check_supported

    lazy = LazyModel(onload_source(spec), dtype=torch.float32)
    check_supported(lazy.model)
    return lazy, load_tokenizer(spec)


def _measure(spec: str, config: AnalyzeConfig, ctx, ids: torch.Tensor, windows: torch.Tensor, seqlen: int,
             opened=None) -> tuple[dict, float]:
    """(DLA, CE) of one model: block by block with onload=true, else with the model loaded whole."""
    from toolkit.remove_ln.train import window_ce

    if config.onload:
        lazy = opened[0] if opened else open_onloaded(spec)[0]
        return analyze_onloaded(lazy, windows, ce_windows(ids, seqlen, config.eval_windows), ctx.device,
                                ctx.progress)
    model = opened[0] if opened else load_any(spec, ctx.device)[0]
    return (direct_logit_attribution(model, windows.to(ctx.device)),
            window_ce(model, ids, seqlen, config.eval_windows, ctx.device))


def run_analyze(config: AnalyzeConfig, ctx) -> dict:
    from toolkit.data.text import load_text, split_text, tokenize

    if config.windows < 1 or config.top < 1 or (config.eval_windows is not None and config.eval_windows < 1):
        raise BadInputError("windows, eval_windows and top must be >= 1")
    opened = open_onloaded(config.model) if config.onload else load_any(config.model, ctx.device)
    model_config, tokenizer = opened[0].config, opened[1]
    seqlen = config.seqlen or min(128, model_config.n_positions)
    if not 2 <= seqlen <= model_config.n_positions:
        raise BadInputError(f"seqlen must be in [2, {model_config.n_positions}], got {seqlen}")
    text = load_text(config.data)
    if config.data is None:
        text = split_text(text, test_fraction=0.05, seed=0)[1]
    ids = tokenize(tokenizer, text)
    count = min(config.windows, (ids.numel() - 1) // seqlen)
    if count < 1:
        raise BadInputError(f"text has {ids.numel()} tokens, fewer than one window of {seqlen}")
    windows = ids[:count * seqlen].view(count, seqlen)
    ctx.inputs.update(model=config.model, reference=config.reference)
    result, ce = _measure(config.model, config, ctx, ids, windows, seqlen, opened)
    del opened
    ctx.metrics.update(ce=ce, dla_max_abs_err=result["max_abs_err"], dla_scale=result["scale"],
                       max_abs_logit=result["max_abs_logit"], onload=config.onload)
    ranked = sorted(result["per_component"].items(), key=lambda kv: -abs(kv[1]))
    ctx.metrics["top_components"] = {name: value for name, value in ranked[:config.top]}
    report = {"model": config.model, "dla": result}
    if config.reference:
        ref, ref_ce = _measure(config.reference, config, ctx, ids, windows, seqlen)
        ctx.baselines.update(ce=ref_ce, dla_max_abs_err=ref["max_abs_err"])
        report["reference"] = {"model": config.reference, "dla": ref}
    if ctx.out is not None:
        write_json(ctx.path("dla.json"), report)
    return ctx.metrics


def plan_analyze(config: AnalyzeConfig, ctx) -> dict:
    """--dry-run: DLA and CE in one pass over the blocks, one block in memory with onload=true."""
    import json
    from pathlib import Path

    from toolkit.nn.onload_stats import stats_plan

    if config.onload:  # as the run checks them; a zoo name is not built for a dry run
        for spec in filter(None, (config.model, config.reference)):
            if not spec.startswith("zoo:"):
                onload_source(spec)
    path = Path(str(config.model)).expanduser() / "config.json"
    arch = json.loads(path.read_text()) if path.is_file() else {}
    seqlen = config.seqlen or min(128, arch.get("n_positions", 1024))
    windows = config.windows + (config.eval_windows or config.windows)
    logits = 3 * config.windows * seqlen * arch.get("vocab_size", 0) * 4  # logits, the DLA sum, their difference
    return {"onload": config.onload, "seqlen": seqlen, "dla_windows": config.windows,
            "ce_windows": config.eval_windows, "memory": stats_plan(config.model, onload=config.onload,
                                                                    windows=windows, seqlen=seqlen,
                                                                    batch=max(config.windows, CE_BATCH),
                                                                    statistics_bytes=logits)}
