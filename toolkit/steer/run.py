"""run() for `iclrkit steer pcms|ums|ilcs` and `steer generate`; the configs of every steer command (`steer sweep`
runs in toolkit.steer.sweep).

Paper: "Inference-Time Personalized Safety Control via Paired Difference-in-Means Intervention" (PCMS),
OpenReview https://openreview.net/forum?id=VHiHVBNy1M — no official repository. Layer, token position and alpha
are not given by the paper, so they are knobs here and `steer sweep` reports the whole grid.
"""

from __future__ import annotations

import json
from typing import Literal, Optional

from pydantic import Field, field_validator

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, require
from toolkit.core.fields import BlockIndex, data_field, layers_field, model_field, onload_field, signed
from toolkit.core.records import JsonlWriter
from toolkit.core.registry import registry

Method = str  # a registered estimator (toolkit/steer/methods/): pcms, ums, ilcs, ...


def _registered(value):
    for name in [value] if isinstance(value, str) else value:
        if name not in registry("steer"):
            raise ValueError(f"unknown steering method '{name}' (known: {', '.join(registry('steer').names())})")
    return value
Position = Literal["last", "mean"]
Operator = Literal["add", "ablate", "clip"]  # clip: beyond the paper, see intervene.steer_fn


class SteerConfig(BaseConfig):
    """Estimate a category direction at chosen layers from {undesired, neutral} examples."""

    model: str = model_field()
    data: str = data_field(..., description="JSONL; a record with both `undesired` and `neutral` is a "
                                            "topic-matched pair.")
    method: Method = "pcms"
    layers: Optional[list[BlockIndex]] = layers_field("Block index (repeatable; default: the middle block).")
    position: Position = Field("last", description="Read activations at the 'last' token or the 'mean'.")
    pair_index: int = 0  # ILCS: which pair gives the single-instance direction
    split_repeats: int = 20  # random halvings averaged in the split-half cosine
    batch_size: int = 16
    onload: bool = onload_field()  # blocks 0..max(layers) one at a time (intervene.read_activations_onloaded)

    _method = field_validator("method")(_registered)


class GenerateConfig(BaseConfig):
    """Generate with one or more saved directions subtracted (personalisation: several categories at once)."""

    model: str = model_field()
    directions: list[str] = Field(description="directions.safetensors (repeatable: categories add up).",
                                  json_schema_extra={"flag": "--direction"})
    prompts: list[str] = Field([], description="Prompt text (repeatable).", json_schema_extra={"flag": "--prompt"})
    data: Optional[str] = data_field(description="JSONL with a `prompt` field, added to the prompts.")
    alpha: float = Field(1.0, description="Steering strength.", json_schema_extra=signed())
    operator: Operator = Field("add", description="add (h - alpha*v) | ablate (remove the projection) | clip "
                                                  "(remove only the excess over --set clip_threshold=T).")
    clip_threshold: float = 0.0  # clip only: the projection level above which h is shrunk
    layers: Optional[list[BlockIndex]] = layers_field("Block index (repeatable; default: every layer stored in the "
                                               "direction files).")
    max_new_tokens: int = Field(40, ge=1, description="Tokens to generate.")
    batch_size: int = 16


class SweepConfig(BaseConfig):
    """Method x layer x alpha grid with category probability, neutral KL, perplexity ratio and stability."""

    model: str = model_field()
    data: str = data_field(..., description="JSONL {undesired, neutral} examples the directions are estimated on.")
    prompts: str = Field(description="JSONL {prompt, kind: category|neutral}.")
    lexicon: list[str]
    judge_data: Optional[str] = None  # {undesired, neutral} texts for the embedding classifier (default: data)
    judge_encoder: str = "minilm"  # 'minilm' = the installed all-MiniLM-L6-v2, or a local encoder directory
    neutral_text: Optional[str] = None  # perplexity text (default: the neutral prompts)
    ppl_tokens: int = 2048
    methods: list[Method] = Field(["pcms", "ums", "ilcs"], description="Estimator (repeatable).",
                                  json_schema_extra={"flag": "--method"})
    layers: Optional[list[BlockIndex]] = layers_field("Block index (repeatable; default: 3 blocks spread over the middle "
                                               "third).")
    # Extra settings that steer several layers at once, each with its own direction estimated at that layer and the
    # same alpha (rows get layer "12+15"). Beyond the paper, which gives no layer: an option, not the default.
    layer_groups: list[list[int]] = []
    alphas: list[float] = Field([0.5, 1.0, 2.0, 4.0], description="Strength (repeatable).",
                                json_schema_extra=signed({"flag": "--alpha"}))
    operator: Operator = Field("add", description="How the direction is applied.")
    position: Position = "last"
    unit_norm: bool = False  # scale v to length 1 (alpha in activation units) instead of the raw mean shift
    max_new_tokens: int = 32
    split_repeats: int = 20
    pair_index: int = 0
    batch_size: int = 16

    _methods = field_validator("methods")(_registered)


def load_examples(path: str) -> tuple[list[str], list[str], int]:
    """(undesired, neutral, n_pairs): paired records come first, in file order, so row i of each list is pair i."""
    from toolkit.data.text import read_jsonl

    records = read_jsonl(path)
    paired = [r for r in records if "undesired" in r and "neutral" in r]
    lone_u = [r["undesired"] for r in records if "undesired" in r and "neutral" not in r]
    lone_n = [r["neutral"] for r in records if "neutral" in r and "undesired" not in r]
    require(all("undesired" in r or "neutral" in r for r in records),
            f"{path}: every record needs an 'undesired' and/or a 'neutral' text")
    undesired = [r["undesired"] for r in paired] + lone_u
    neutral = [r["neutral"] for r in paired] + lone_n
    for text in undesired + neutral:
        require(isinstance(text, str) and text.strip() != "", f"{path}: example texts must be non-empty strings")
    require(len(undesired) > 0 and len(neutral) > 0, f"{path}: need at least one undesired and one neutral example")
    return undesired, neutral, len(paired)


def _method_inputs(method: str, undesired, neutral, n_pairs: int):
    """Paired estimators see only the pairs; an unpaired one (UMS) sees every example."""
    if not registry("steer").get(method).meta.get("paired", True):
        return undesired, neutral
    require(n_pairs >= 1, f"{method.upper()} needs paired records (both 'undesired' and 'neutral' on one line)")
    return undesired[:n_pairs], neutral[:n_pairs]


def _default_layers(total: int, count: int) -> list[int]:
    low, high = total // 3, (2 * total) // 3
    if count == 1:
        return [total // 2]
    return sorted({round(low + i * (high - low) / (count - 1)) for i in range(count)})


def _load(model_spec: str, ctx):
    from toolkit.models.source import load_model

    model, tokenizer = load_model(model_spec, ctx.device, ctx.torch_dtype)
    ctx.inputs["model"] = model_spec
    return model, tokenizer


def run_estimate(config: SteerConfig, ctx) -> dict:
    from toolkit.steer.estimators import estimate, split_half_cosine
    from toolkit.steer.intervene import check_layers, model_fingerprint, num_layers, read_activations, save_directions

    undesired, neutral, n_pairs = load_examples(config.data)
    undesired, neutral = _method_inputs(config.method, undesired, neutral, n_pairs)
    if config.onload:
        layers, acts_u, acts_n, fingerprint = _onloaded_activations(config, ctx, undesired, neutral)
    else:
        model, tokenizer = _load(config.model, ctx)
        layers = check_layers(model, config.layers or _default_layers(num_layers(model), 1))
        acts_u = read_activations(model, tokenizer, undesired, layers, config.position, config.batch_size,
                                  ctx.device)
        acts_n = read_activations(model, tokenizer, neutral, layers, config.position, config.batch_size, ctx.device)
        fingerprint = model_fingerprint(model)
    directions, per_layer = {}, {}
    for layer in layers:
        directions[layer] = estimate(config.method, acts_u[layer], acts_n[layer], config.pair_index)
        stats = {"norm": float(directions[layer].norm())}
        if min(len(undesired), len(neutral)) >= 2:
            stats["split_half_cosine"] = split_half_cosine(config.method, acts_u[layer], acts_n[layer],
                                                           config.split_repeats, ctx.seed)
        per_layer[str(layer)] = stats
    save_directions(ctx.path("directions.safetensors"), directions,
                    {"method": config.method, "layers": json.dumps(layers), "position": config.position,
                     "model": config.model, "model_fingerprint": fingerprint})
    ctx.metrics.update({"method": config.method, "n_undesired": len(undesired), "n_neutral": len(neutral),
                        "n_pairs": n_pairs, "layers": per_layer, "onload": config.onload})
    return ctx.metrics


def _onloaded_activations(config: SteerConfig, ctx, undesired: list[str], neutral: list[str]):
    """(layers, undesired rows, neutral rows, model fingerprint) read with one block in memory (onload=true)."""
    import torch

    from toolkit.models.lazy import LazyModel, onload_source
    from toolkit.models.source import load_tokenizer
    from toolkit.steer.intervene import check_layers, read_activations_onloaded

    lazy = LazyModel(onload_source(config.model), dtype=ctx.torch_dtype or torch.float32)
    ctx.inputs["model"] = config.model
    layers = check_layers(lazy.model, config.layers or _default_layers(len(lazy.layers), 1))
    acts, fingerprint = read_activations_onloaded(lazy, load_tokenizer(config.model), undesired + neutral, layers,
                                                  config.position, config.batch_size, ctx.device, ctx.progress)
    count = len(undesired)
    return (layers, {l: a[:count] for l, a in acts.items()}, {l: a[count:] for l, a in acts.items()},
            fingerprint)


def plan_estimate(config: SteerConfig, ctx) -> dict:
    """--dry-run: the activation pass, block by block with onload=true (blocks 0..max(layers))."""
    from pathlib import Path

    from toolkit.nn.onload_stats import check_onload_source, stats_plan

    if config.onload:
        check_onload_source(config.model)
    undesired, neutral, n_pairs = load_examples(config.data)
    undesired, neutral = _method_inputs(config.method, undesired, neutral, n_pairs)
    plan = {"method": config.method, "n_undesired": len(undesired), "n_neutral": len(neutral),
            "layers": config.layers or "default (the middle block)", "position": config.position}
    texts, longest = undesired + neutral, 1
    if Path(str(config.model), "config.json").is_file():  # an upper bound: every text as long as the longest
        from toolkit.models.source import load_tokenizer

        tokenizer = load_tokenizer(config.model)
        longest = max(len(tokenizer(text)["input_ids"]) for text in texts)
    plan["memory"] = stats_plan(config.model, onload=config.onload, windows=len(texts), seqlen=longest,
                                blocks=max(config.layers) + 1 if config.layers else None, batch=config.batch_size)
    if not config.layers and "blocks" in plan["memory"]:
        plan["memory"]["blocks_read"] = _default_layers(plan["memory"]["blocks"], 1)[0] + 1
    return plan


def plan_generate(config, ctx) -> dict:
    """--dry-run of `steer generate` / `steer sweep`: generation under steering needs the whole model."""
    from toolkit.nn.onload_stats import inference_plan

    return {"memory": inference_plan(config.model, "steered generation runs every block for each new token (and "
                                     "sweep scores perplexity and KL through the whole model), so the model is "
                                     "loaded whole")}


def _prompt_list(config: GenerateConfig) -> list[str]:
    from toolkit.data.text import read_jsonl

    prompts = list(config.prompts)
    if config.data:
        prompts += [str(r["prompt"]) for r in read_jsonl(config.data, required=("prompt",))]
    require(len(prompts) > 0, "no prompts: pass --prompt TEXT or --data FILE.jsonl with a 'prompt' field")
    return prompts


def load_checked_directions(paths: list[str], model, layers: Optional[list[int]]):
    """[(layer, v)] from the files, refusing a file made on another model or a layer the model does not have."""
    from toolkit.steer.intervene import check_layers, load_directions, model_fingerprint

    require(len(paths) > 0, "give at least one --direction file")
    fingerprint, edits = model_fingerprint(model), []
    for path in paths:
        directions, metadata = load_directions(path)
        stored = metadata.get("model_fingerprint")
        if stored and stored != fingerprint:
            raise BadInputError(f"{path} was estimated on another model (fingerprint {stored}, this model {fingerprint})",
                                f"it was made from {metadata.get('model', '?')}")
        wanted = layers or sorted(directions)
        for layer in check_layers(model, wanted):
            require(layer in directions, f"{path} has no direction for layer {layer} (it has {sorted(directions)})")
            edits.append((layer, directions[layer]))
    return edits


def run_generate(config: GenerateConfig, ctx) -> dict:
    from toolkit.steer.evaluate import generate
    from toolkit.steer.intervene import steering

    prompts = _prompt_list(config)
    model, tokenizer = _load(config.model, ctx)
    edits = load_checked_directions(config.directions, model, config.layers)
    with steering(model, edits, config.alpha, config.operator, [config.clip_threshold] * len(edits)):
        steered, _ = generate(model, tokenizer, prompts, config.max_new_tokens, None, config.batch_size, ctx.device)
    plain, _ = generate(model, tokenizer, prompts, config.max_new_tokens, None, config.batch_size, ctx.device)
    with JsonlWriter(ctx.path("generations.jsonl")) as handle:
        handle.write_all({"prompt": prompt, "steered": text, "unsteered": base}
                         for prompt, text, base in zip(prompts, steered, plain))
    ctx.metrics.update({"prompts": len(prompts), "edits": len(edits), "alpha": config.alpha,
                        "operator": config.operator, "changed": sum(a != b for a, b in zip(steered, plain))})
    return ctx.metrics
