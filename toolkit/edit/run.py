"""The run every edit method shares: MEMIT's pipeline (Meng et al., ICLR 2023), with the method's value strategy.

Paper: https://arxiv.org/abs/2210.07229 · official code: https://github.com/kmeng01/memit

For each request (s, r, o): keys k (the input of the MLP down-projection at the subject's last token, averaged
over random-prefix contexts) at the edit layers R; a target z = h + δ of the last edit layer's output, where δ
makes the model say o; then, layer by layer, ΔW = resid · Kᵀ (λC + K Kᵀ)⁻¹ with C = E[k kᵀ] over text and
resid = (Z − H_cur) / (layers left). Speed: the δ of many requests are optimised together, and each step runs
only the blocks above the last edit layer on that layer's cached output, only from each subject's last token on (the
tokens before it come from a KV cache), and only for the requests still optimising.

The method is the one `config.method` names in the "edit" registry (toolkit/edit/methods/): its registered
function gives the extra loss on δ (EAMET's embedding alignment) or None (MEMIT). The run record is run.json (the
runner writes it from ctx.metrics/ctx.baselines); this module writes results.jsonl, values.safetensors and the
edited model.
"""

from __future__ import annotations

import time

import torch

from toolkit.core.errors import BadInputError
from toolkit.core.registry import registry
from toolkit.edit.config import MemitConfig
from toolkit.edit.context import EditContext
from toolkit.edit.covariance import context_templates, key_covariance, model_fingerprint, stats_dir
from toolkit.edit.insert import insert, insertion_reach
from toolkit.edit.keys import block_outputs, check_layers, compute_keys, default_layers, target_ids
from toolkit.edit.outcome import check_edit
from toolkit.edit.value_cache import FILE_NAME as VALUES_FILE
from toolkit.edit.value_cache import facts_digest, load_values, save_values
from toolkit.edit.values import optimise_values


def method_of(config: MemitConfig):
    """The registered edit method `config.method` names; its config class must be the method's own."""
    entry = registry("edit").get(config.method)
    if entry.config is not None and not isinstance(config, entry.config):
        raise BadInputError(f"edit method '{entry.name}' needs a {entry.config.__name__}, got "
                            f"{type(config).__name__}")
    return entry


def run(config: MemitConfig, ctx) -> dict:
    """Load, covariance, (batched) edits with the method's value strategy, metrics, saved model."""
    from toolkit.edit.facts import load_facts
    from toolkit.edit.metrics import evaluate, write_per_record

    method = method_of(config)
    technique = f"edit.{method.name}"
    facts = load_facts(config.data, config.n_edits)
    model, tokenizer, ectx, layers, covs, cov_seconds = _prepare(config, ctx, facts)
    before, after = [], []  # per-record scores -> results.jsonl
    if config.eval_before:
        ctx.baselines["unedited"] = evaluate(model, tokenizer, facts, config, ctx.device, ctx.progress,
                                             per_record=before)
    edit = _edit_batches(config, ctx, method, ectx, facts, layers, covs)
    metrics = evaluate(model, tokenizer, facts, config, ctx.device, ctx.progress, per_record=after)
    write_per_record(ctx.path("results.jsonl"), before, after)
    metrics.update(_edit_metrics(config, edit))
    check_edit(ctx, config, metrics, nll=edit["nll"], delta=edit["delta"], h=edit["h"],
               keys_z=edit["keys_z"])  # values converged, δ inserted, efficacy moved: else one warning
    metrics.update({"n_edits": len(facts), "layers": layers, "edit_seconds": round(edit["seconds"], 2),
                    "covariance_seconds": round(cov_seconds, 2), "covariance_onloaded": config.onload})
    if edit["per_batch"]:
        metrics["batches"] = edit["per_batch"]
    ctx.metrics.update(metrics)  # the run record: the runner writes it to run.json
    if config.save_model:
        from toolkit.models.save import save_model

        save_model(model, tokenizer, ctx.path("model"), technique=technique, source=config.model,
                   paper=method.meta.get("paper", ""),
                   metadata={"technique": technique, "layers": layers, "n_edits": len(facts)})
    return metrics


def _prepare(config: MemitConfig, ctx, facts):
    """(model, tokenizer, edit context with its templates, layers, covariances, covariance seconds): the facts'
    targets checked before any expensive work, the covariance read from the cache or computed."""
    from toolkit.data.text import load_text
    from toolkit.models.source import load_model

    covs, cov_seconds = _onloaded_covariance(config, ctx, facts) if config.onload else (None, 0.0)
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)  # the edit needs the whole model
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    ectx = EditContext.of(model, tokenizer, ctx.device, batch=config.eval_batch, progress=ctx.progress)
    layers = check_layers(config.layers if config.layers is not None else default_layers(ectx.n_layers),
                          ectx.n_layers)
    for request in facts:  # fail on bad records before any expensive work
        target_ids(tokenizer, request.target_new, request.record_id)
    ctx.inputs.update({"model": config.model, "data": config.data})
    if covs is None:
        clock = time.perf_counter()
        ctx.record_cache("edit-stats", stats_dir(config.stats_dir))  # written outside --out: named in run.json
        covs = key_covariance(ectx, layers, load_text(config.cov_data), config.cov_tokens, config.cov_seqlen,
                              stats_dir(config.stats_dir))
        cov_seconds = time.perf_counter() - clock
    templates = context_templates(ectx, config.context_prefixes, config.prefix_tokens)
    return model, tokenizer, ectx.with_templates(templates), layers, covs, cov_seconds


def _edit_batches(config: MemitConfig, ctx, method, ectx: EditContext, facts, layers, covs) -> dict:
    """Keys, values (the method's strategy, or δ reused from an earlier run) and insertion, batch by batch; the
    per-request tensors are saved to values.safetensors. Returns them with the edit seconds and per-batch scores."""
    from toolkit.edit.metrics import evaluate

    device, batch = ctx.device, config.batch_size or len(facts)
    identity = {"model": model_fingerprint(ectx.model), "facts": facts_digest(facts), "templates": ectx.templates,
                "layers": layers}
    saved = None
    if config.values:
        if batch < len(facts):
            raise BadInputError("values can be reused only when all facts are edited in one batch",
                                "later batches' δ depend on the earlier batches' insertion; drop batch_size")
        saved = load_values(config.values, identity)
        ctx.inputs["values"] = config.values
    parts = {name: [] for name in ("keys_z", "delta", "h", "nll", "reach")}
    per_batch, seconds = [], 0.0
    alignment = method.obj(config) if saved is None else None  # the method's extra loss on δ (None: MEMIT's)
    for start in range(0, len(facts), batch):
        clock = time.perf_counter()
        chunk = facts[start:start + batch]
        if saved is not None:
            span = slice(start, start + len(chunk))
            keys_z, delta, h, nll = (saved[name][span].to(device) for name in ("keys_z", "delta", "h", "nll"))
        else:
            keys_z = compute_keys(ectx, chunk, [layers[-1]])[layers[-1]]
            if alignment is not None:
                alignment.begin_batch(keys_z)
            delta, h, nll = optimise_values(ectx, chunk, keys_z, config, layers[-1], alignment)
        norms = insert(ectx, chunk, h + delta, layers, covs, config.mom2_update_weight)
        seconds += time.perf_counter() - clock
        reached = block_outputs(ectx, chunk, layers[-1])
        for name, value in (("reach", insertion_reach(reached, h, delta)), ("nll", nll), ("keys_z", keys_z),
                            ("delta", delta), ("h", h)):
            parts[name].append(value)
        if config.batch_size:
            scores = evaluate(ectx.model, ectx.tokenizer, chunk, config, device, None, parts=("efficacy",))
            per_batch.append({"start": start, "size": len(chunk), **scores,
                              **{f"delta_w_norm_layer{l}": v for l, v in norms.items()}})
    joined = {name: torch.cat(values) for name, values in parts.items()}
    save_values(ctx.path(VALUES_FILE), {k: joined[k] for k in ("delta", "h", "nll", "keys_z")}, identity)
    return {**joined, "seconds": seconds, "per_batch": per_batch}


def _edit_metrics(config: MemitConfig, edit: dict) -> dict:
    """The two stages that must both succeed for a strict edit: δ makes the model say o (value_nll), the weights
    produce δ (insertion_reach); and the alignment of δ with the keys."""
    from toolkit.edit.metrics import alignment_spearman

    metrics = {"alignment_spearman": alignment_spearman(edit["keys_z"], edit["delta"]),
               "value_nll": round(float(edit["nll"].mean()), 4),
               "insertion_reach": round(float(edit["reach"].mean()), 4)}
    if config.values:
        metrics["values_from"] = config.values  # δ reused: edit_seconds covers the insertion only
    return metrics


def _onloaded_covariance(config: MemitConfig, ctx, facts) -> tuple[dict, float]:
    """(covariances, seconds) with one block in memory (onload=true), before the whole model is loaded for the
    edit: the layers and the facts' targets are checked first, as the resident path does."""
    from toolkit.data.text import load_text
    from toolkit.edit.covariance import key_covariance_onloaded
    from toolkit.models.lazy import LazyModel, onload_source
    from toolkit.models.source import load_tokenizer

    lazy = LazyModel(onload_source(config.model), dtype=ctx.torch_dtype or torch.float32)
    tokenizer = load_tokenizer(config.model)
    n_layers = len(lazy.layers)
    layers = check_layers(config.layers if config.layers is not None else default_layers(n_layers), n_layers)
    for request in facts:
        target_ids(tokenizer, request.target_new, request.record_id)
    clock = time.perf_counter()
    ctx.record_cache("edit-stats", stats_dir(config.stats_dir))
    covs = key_covariance_onloaded(lazy, tokenizer, layers, load_text(config.cov_data), config.cov_tokens,
                                   config.cov_seqlen, stats_dir(config.stats_dir), device=ctx.device,
                                   progress=ctx.progress)
    return covs, time.perf_counter() - clock


def plan(config: MemitConfig, ctx) -> dict:
    from toolkit.edit.facts import load_facts

    method = method_of(config)
    facts = load_facts(config.data, config.n_edits)
    return {"method": method.name, "n_edits": len(facts),
            "layers": config.layers or "default ([3,4] with >= 8 blocks)",
            "batch_size": config.batch_size or len(facts), "stats_dir": str(stats_dir(config.stats_dir)),
            "memory": _memory_plan(config, ctx)}


def _memory_plan(config: MemitConfig, ctx) -> dict:
    """The covariance pass (block by block with onload=true) and the edit, which needs the whole model."""
    from pathlib import Path

    from toolkit.nn.onload_stats import check_onload_source, inference_plan, stats_plan

    if config.onload:
        check_onload_source(config.model)
    dtype = ctx.torch_dtype or torch.float32
    covariance = {"onload": config.onload, "mb": "not planned: --model is not a local directory with config.json"}
    source = Path(str(config.model)).expanduser()
    if (source / "config.json").is_file():
        from toolkit.models.memory import skeleton
        from toolkit.models.view import view_of

        view = view_of(skeleton(source))
        layers = config.layers if config.layers is not None else default_layers(len(view))
        keys = view.dims()["intermediate"]  # the down-projection's input width (meta weights: no probe)
        covariance = stats_plan(str(source), onload=config.onload, windows=max(1, -(-config.cov_tokens //
                                config.cov_seqlen)), seqlen=config.cov_seqlen, blocks=max(layers) + 1, batch=8,
                                statistics_bytes=len(layers) * keys * keys * 8, compute_dtype=dtype)
    edit = inference_plan(str(config.model), "the context prefixes and the fluency evaluation generate text "
                          "(every block per token), the value optimisation backpropagates through the blocks above "
                          "the last edit layer, and each batch's update rewrites the edit layers before the next "
                          "batch's keys are read: the whole model is loaded after the covariance pass",
                          compute_dtype=dtype)
    return {"covariance": covariance, "edit": edit}
