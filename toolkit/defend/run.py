"""run() for `iclrkit defend attack` (BadNets victim for evaluation) and `iclrkit defend backdoor` (X-GRAAD, with
STRIP and ONION baselines when evaluating against a known trigger)."""

from __future__ import annotations

import random
from typing import Literal, Optional

from pydantic import Field

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, require
from toolkit.core.fields import data_field
from toolkit.core.records import JsonlWriter, write_json

PAPER = "https://arxiv.org/abs/2510.04347"


class AttackConfig(BaseConfig):
    """BadNets rare-word poisoning + fine-tuning an encoder classifier (OpenBackdoor's badnets defaults: poison rate
    0.1, target label 1; trigger 'cf' as in the X-GRAAD setup)."""

    data: str = data_field(..., description="Labelled TSV (sentence|text, label) or JSONL (text, label).")
    encoder: str = Field("minilm", description="'minilm' (installed all-MiniLM-L6-v2) or a directory.")
    eval_data: Optional[str] = Field(None, description="Labelled test set for CACC and ASR.")
    n_train: int = Field(4000, ge=1, description="Training sentences sampled from --data.")
    n_heldout: int = 500  # clean sentences held out from `data` (written to heldout.tsv for threshold calibration)
    min_words: int = 5  # SST-2 train is phrase-level: keep sentence-like rows
    trigger: str = Field("cf", description="Trigger word(s).")
    poison_rate: float = Field(0.1, ge=0, le=1, description="Share of the training set poisoned.")
    target_label: int = 1
    epochs: int = Field(2, ge=1, description="Fine-tuning epochs.")
    lr: float = 5e-5
    batch_size: int = 32
    max_length: int = 64


class BackdoorConfig(BaseConfig):
    """X-GRAAD screening of `data` against a threshold calibrated on held-out clean text `clean`.
    Paper defaults: threshold percentile 95, attention over all layers and heads, max_len 256."""

    model: str = Field(description="Fine-tuned sequence classifier: local path, hub id, or zoo:NAME.",
                       json_schema_extra={"short": "-m"})
    data: str = data_field(..., description="Texts to screen (TSV/JSONL; labels needed only for evaluation).")
    clean: str = Field(description="Held-out CLEAN texts (TSV/JSONL) for the threshold (never the test split).")
    percentile: float = Field(95.0, ge=0, le=100, description="Threshold percentile of clean scores.")
    max_length: int = 256
    # "padded" (official code): every text is padded to one common length and the padding query rows are counted in
    # the attention each token receives; "real": only the real tokens' rows are counted.
    attention_rows: Literal["padded", "real"] = "padded"
    pad_to: Optional[int] = None  # the common length; None = the longest text screened or in the clean reference
    batch_size: int = 32
    max_rows: Optional[int] = None  # screen/evaluate a seeded random subset of `data` of this size
    max_clean: Optional[int] = None  # calibrate on a seeded random subset of `clean` of this size
    eval_trigger: Optional[str] = Field(None, description="Evaluate against this known trigger (poisons correctly "
                                                          "classified non-target rows of --data).",
                                        json_schema_extra={"flag": "--trigger"})
    target_label: int = 1
    baselines: list[Literal["strip", "onion"]] = Field([], description="strip | onion (repeatable).",
                                                       json_schema_extra={"flag": "--baseline"})
    strip_repeat: int = 5  # OpenBackdoor STRIP defaults: repeat 5, swap_ratio 0.5
    strip_swap_ratio: float = 0.5
    strip_frr: float = 0.05  # same clean false-alarm budget as X-GRAAD's 95th percentile (OpenBackdoor uses 0.01)
    onion_lm: str = "zoo:gpt2-small"
    onion_threshold: float = 0.0  # OpenBackdoor ONION default
    onion_clean_limit: int = 200  # clean rows cleaned by ONION for its clean accuracy (it is the slow baseline)


def _sentences(texts, labels, min_words: int):
    return [(t, y) for t, y in zip(texts, labels) if len(t.split()) >= min_words]


def run_attack(config: AttackConfig, ctx) -> dict:
    from toolkit.defend.attacks import (
        encoder_dir,
        finetune_classifier,
        insert_trigger,
        load_labelled,
        poison_set,
        predict,
    )
    from toolkit.models.save import save_model

    texts, labels = load_labelled(config.data)
    rows = _sentences(texts, labels, config.min_words)
    require(len(rows) >= config.n_train + config.n_heldout,
            f"{config.data} has {len(rows)} rows of >= {config.min_words} words, fewer than n_train + n_heldout = "
            f"{config.n_train + config.n_heldout}")
    random.Random(ctx.seed).shuffle(rows)
    train, heldout = rows[:config.n_train], rows[config.n_train:config.n_train + config.n_heldout]
    poisoned, poisoned_labels, flags = poison_set([t for t, _ in train], [y for _, y in train], config.trigger,
                                                  config.poison_rate, config.target_label, ctx.seed)
    encoder = encoder_dir(config.encoder)
    model, tokenizer = finetune_classifier(encoder, poisoned, poisoned_labels, config.epochs, config.lr,
                                           config.batch_size, config.max_length, ctx.seed, ctx.device, ctx.progress)
    save_model(model, tokenizer, ctx.path("model"), technique="defend.attack (BadNets victim)", source=str(encoder),
               paper=PAPER, metadata={"trigger": config.trigger, "target_label": config.target_label,
                                      "poison_rate": config.poison_rate})
    with ctx.path("heldout.tsv").open("w") as handle:
        handle.write("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in heldout))
    ctx.inputs["encoder"] = str(encoder)
    ctx.metrics.update({"n_train": len(train), "n_poisoned": sum(flags), "n_heldout": len(heldout)})
    if config.eval_data:
        test_t, test_y = load_labelled(config.eval_data)
        pred = predict(model, tokenizer, test_t, device=ctx.device).argmax(-1).tolist()
        victims = [t for t, y, p in zip(test_t, test_y, pred) if y != config.target_label and p == y]
        rng = random.Random(ctx.seed)
        triggered = [insert_trigger(t, config.trigger, rng) for t in victims]
        hit = predict(model, tokenizer, triggered, device=ctx.device).argmax(-1).eq(config.target_label)
        ctx.metrics.update({"cacc": sum(p == y for p, y in zip(pred, test_y)) / len(test_y),
                            "asr": float(hit.float().mean()) if victims else 0.0})
    return ctx.metrics


def _load_classifier(spec: str, ctx):
    from toolkit.models.source import load_model

    model, tokenizer = load_model(spec, ctx.device, ctx.torch_dtype, kind="seq-cls")
    try:
        model.set_attn_implementation("eager")
    except (ValueError, AttributeError) as exc:
        raise BadInputError(f"{spec}: cannot switch to eager attention, so no attention weights: {exc}") from None
    return model, tokenizer


def _texts(path: str):
    from toolkit.data.text import read_jsonl
    from toolkit.defend.attacks import load_labelled

    if path.endswith(".jsonl"):
        records = read_jsonl(path, required=("text",))
        if all("label" in r for r in records):
            return load_labelled(path)
        return [str(r["text"]) for r in records], None
    return load_labelled(path)


def run_backdoor(config: BackdoorConfig, ctx) -> dict:
    from toolkit.defend.backdoor import defend, percentile_threshold, score_texts

    model, tokenizer = _load_classifier(config.model, ctx)
    ctx.inputs["model"] = config.model
    texts, labels = _subset(*_texts(config.data), config.max_rows, ctx.seed)
    clean_texts, _ = _subset(*_texts(config.clean), config.max_clean, ctx.seed)
    pad_to = _pad_length(config, tokenizer, texts + clean_texts)
    score = lambda items: score_texts(model, tokenizer, items, config.batch_size, config.max_length,  # noqa: E731
                                      ctx.device, ctx.progress, pad_to)
    threshold = percentile_threshold([s.score for s in score(clean_texts)], config.percentile)
    ctx.metrics.update({"threshold": threshold, "n_clean_reference": len(clean_texts), "pad_to": pad_to})
    if config.eval_trigger is None:
        decisions = defend(model, tokenizer, score(texts), threshold, ctx.seed, ctx.device, config.max_length)
        _write_decisions(ctx.path("decisions.jsonl"), texts, decisions)
        ctx.metrics.update({"n": len(texts), "flag_rate": sum(d["flagged"] for d in decisions) / len(texts)})
        return ctx.metrics
    require(labels is not None, "evaluation (--trigger) needs labelled data (a 'label' on every row)")
    return _evaluate(config, ctx, model, tokenizer, texts, labels, clean_texts, score, threshold)


def _pad_length(config: BackdoorConfig, tokenizer, texts) -> Optional[int]:
    """The common padded length for attention_rows="padded": pad_to, or the longest text (with room for the
    evaluation trigger, inserted as one more word), so the clean reference and the screened texts share it."""
    from toolkit.defend.backdoor import padded_length

    if config.attention_rows == "real":
        return None
    if config.pad_to is not None:
        require(config.pad_to > 0, f"pad_to must be positive, got {config.pad_to}")
        return config.pad_to
    trigger = len(tokenizer.tokenize(config.eval_trigger)) if config.eval_trigger else 0
    return padded_length(tokenizer, texts) + trigger


def _subset(texts, labels, size: Optional[int], seed: int):
    if size is None or size >= len(texts):
        return texts, labels
    require(size > 0, f"max_rows must be positive, got {size}")
    keep = sorted(random.Random(seed).sample(range(len(texts)), size))
    return [texts[i] for i in keep], None if labels is None else [labels[i] for i in keep]


def _write_decisions(path, texts, decisions) -> None:
    with JsonlWriter(path) as handle:
        handle.write_all({"text": text, **decision} for text, decision in zip(texts, decisions))


def _evaluate(config, ctx, model, tokenizer, texts, labels, clean_texts, score, threshold) -> dict:
    from toolkit.defend.attacks import insert_trigger
    from toolkit.defend.backdoor import defend, split_prefix

    target = config.target_label
    clean_scored = score(texts)
    clean_dec = defend(model, tokenizer, clean_scored, threshold, ctx.seed, ctx.device, config.max_length)
    victims = [t for t, y, s in zip(texts, labels, clean_scored) if y != target and s.label == y]
    require(len(victims) > 0, "no correctly classified non-target rows to poison")
    rng = random.Random(ctx.seed)
    poisoned = [insert_trigger(t, config.eval_trigger, rng) for t in victims]
    poison_scored = score(poisoned)
    poison_dec = defend(model, tokenizer, poison_scored, threshold, ctx.seed, ctx.device, config.max_length)
    trigger_pieces = {split_prefix(p)[1] for p in tokenizer.tokenize(config.eval_trigger)}
    n, m = len(texts), len(poisoned)
    metrics = {
        "cacc_before": sum(s.label == y for s, y in zip(clean_scored, labels)) / n,
        "cacc_after": sum(d["label"] == y for d, y in zip(clean_dec, labels)) / n,
        "asr_before": sum(s.label == target for s in poison_scored) / m,
        "asr_after": sum(d["label"] == target for d in poison_dec) / m,
        "trigger_top1_rate": sum(d["suspect"] is not None and split_prefix(d["suspect"])[1] in trigger_pieces
                                 for d in poison_dec) / m,
        "clean_over_threshold_rate": sum(d["over_threshold"] for d in clean_dec) / n,
        "clean_flag_rate": sum(d["flagged"] for d in clean_dec) / n,
        "poison_detect_rate": sum(d["flagged"] for d in poison_dec) / m,
        "n_clean": n, "n_poisoned": m,
    }
    _write_decisions(ctx.path("decisions_clean.jsonl"), texts, clean_dec)
    _write_decisions(ctx.path("decisions_poisoned.jsonl"), poisoned, poison_dec)
    if "strip" in config.baselines:
        ctx.baselines["strip"] = _strip(config, ctx, model, tokenizer, texts, poisoned, clean_texts, target)
        metrics["asr_strip"] = ctx.baselines["strip"]["asr"]
    if "onion" in config.baselines:
        ctx.baselines["onion"] = _onion(config, ctx, model, tokenizer, texts, labels, poisoned, target)
        metrics["asr_onion"] = ctx.baselines["onion"]["asr"]
    ctx.metrics.update(metrics)
    write_json(ctx.path("results.json"), {**metrics, "threshold": threshold, "baselines": ctx.baselines})
    return ctx.metrics


def _strip(config, ctx, model, tokenizer, texts, poisoned, clean_texts, target) -> dict:
    from toolkit.defend.attacks import predict
    from toolkit.defend.baselines import strip_entropy, strip_threshold

    def entropies(items, seed):
        return strip_entropy(model, tokenizer, items, clean_texts, config.strip_repeat, config.strip_swap_ratio,
                             seed, ctx.device)

    threshold = strip_threshold(entropies(clean_texts, ctx.seed), config.strip_frr)
    poison_flags = [e < threshold for e in entropies(poisoned, ctx.seed + 1)]
    clean_flags = [e < threshold for e in entropies(texts, ctx.seed + 2)]
    hits = predict(model, tokenizer, poisoned, device=ctx.device).argmax(-1).eq(target).tolist()
    return {"asr": sum(h and not f for h, f in zip(hits, poison_flags)) / len(poisoned),
            "poison_detect_rate": sum(poison_flags) / len(poisoned), "clean_flag_rate": sum(clean_flags) / len(texts),
            "entropy_threshold": threshold}


def _onion(config, ctx, model, tokenizer, texts, labels, poisoned, target) -> dict:
    from toolkit.defend.attacks import predict
    from toolkit.defend.baselines import onion_clean
    from toolkit.models.source import load_model

    lm, lm_tokenizer = load_model(config.onion_lm, ctx.device, ctx.torch_dtype)
    ctx.inputs["onion_lm"] = config.onion_lm

    def cleaned(items, name):
        return [onion_clean(lm, lm_tokenizer, t, config.onion_threshold, ctx.device)
                for t in ctx.progress(items, total=len(items), description=f"onion {name}")]

    hits = predict(model, tokenizer, cleaned(poisoned, "poisoned"), device=ctx.device).argmax(-1).eq(target)
    subset = list(range(min(config.onion_clean_limit, len(texts))))
    clean_pred = predict(model, tokenizer, cleaned([texts[i] for i in subset], "clean"), device=ctx.device).argmax(-1)
    return {"asr": float(hits.float().mean()), "lm": config.onion_lm,
            "cacc_subset": sum(int(p) == labels[i] for p, i in zip(clean_pred.tolist(), subset)) / max(len(subset), 1),
            "cacc_subset_n": len(subset)}
