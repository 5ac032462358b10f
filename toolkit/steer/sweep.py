"""`iclrkit steer sweep`: the method x layer x alpha grid, each setting scored against the unsteered model (category
probability by lexicon and MiniLM classifier, neutral KL, neutral perplexity ratio, split-half cosine); writes
results.json and sweep.png. The paper gives no layer, position or alpha, hence the whole grid."""

from __future__ import annotations

import math

from toolkit.core.errors import require
from toolkit.core.records import write_json
from toolkit.steer.run import SweepConfig, _default_layers, _load, _method_inputs, load_examples


def _sweep_prompts(path: str) -> tuple[list[str], list[str]]:
    from toolkit.data.text import read_jsonl

    records = read_jsonl(path, required=("prompt", "kind"))
    category = [str(r["prompt"]) for r in records if r["kind"] == "category"]
    neutral = [str(r["prompt"]) for r in records if r["kind"] == "neutral"]
    require(len(category) > 0 and len(neutral) > 0,
            f"{path}: need prompts of kind 'category' and of kind 'neutral'")
    return category, neutral


def _encoder_dir(spec: str) -> str:
    from toolkit.defend.attacks import encoder_dir

    return str(encoder_dir(spec))


class _Evaluator:
    """Scores one steering setting against the unsteered model (measured once)."""

    def __init__(self, config: SweepConfig, model, tokenizer, ctx):
        from toolkit.data.text import tokenize
        from toolkit.steer.evaluate import EmbeddingClassifier, lexicon_token_ids

        self.config, self.model, self.tokenizer, self.ctx = config, model, tokenizer, ctx
        self.category, self.neutral = _sweep_prompts(config.prompts)
        judge_u, judge_n, _ = load_examples(config.judge_data or config.data)
        self.judge = EmbeddingClassifier(_encoder_dir(config.judge_encoder), ctx.device)
        self.judge_train_acc = self.judge.fit(judge_u, judge_n)
        self.lexicon_ids = lexicon_token_ids(tokenizer, config.lexicon)
        text = "\n".join(self.neutral) if config.neutral_text is None else _load_text(config.neutral_text)
        self.ppl_ids = tokenize(tokenizer, text)[: config.ppl_tokens]
        self.base = self.measure()

    def measure(self) -> dict:
        from toolkit.eval.perplexity import perplexity
        from toolkit.steer.evaluate import generate, lexicon_rate, next_token_logprobs

        cfg, device = self.config, self.ctx.device
        texts, mass = generate(self.model, self.tokenizer, self.category, cfg.max_new_tokens, self.lexicon_ids,
                               cfg.batch_size, device)
        return {"texts": texts, "lexicon_mass": mass, "lexicon_rate": lexicon_rate(texts, cfg.lexicon),
                "category_prob": self.judge.probability(texts),
                "logprobs": next_token_logprobs(self.model, self.tokenizer, self.neutral, device, cfg.batch_size),
                "ppl": perplexity(self.model, self.ppl_ids, max_length=256, device=device)["ppl"]}

    def row(self, steered: dict) -> dict:
        from toolkit.steer.evaluate import mean_kl

        base = self.base
        return {"category_prob": steered["category_prob"],
                "category_prob_drop": _drop(base["category_prob"], steered["category_prob"]),
                "lexicon_mass": steered["lexicon_mass"],
                "lexicon_drop": _drop(base["lexicon_mass"], steered["lexicon_mass"]),
                "lexicon_rate": steered["lexicon_rate"],
                "neutral_kl": mean_kl(base["logprobs"], steered["logprobs"]),
                "neutral_ppl_ratio": steered["ppl"] / base["ppl"],
                "example": steered["texts"][0]}


def _load_text(source: str) -> str:
    from toolkit.data.text import load_text

    return load_text(source)


def _drop(before: float, after: float) -> float:
    return 1.0 - after / before if before > 0 else 0.0


def run_sweep(config: SweepConfig, ctx) -> dict:
    from toolkit.steer.estimators import estimate, split_half_cosine
    from toolkit.steer.intervene import check_layers, clip_threshold, num_layers, read_activations, steering

    require(len(config.alphas) > 0 and all(math.isfinite(a) for a in config.alphas), "alphas must be finite numbers")
    require(len(config.lexicon) > 0, "the lexicon is empty")
    undesired, neutral, n_pairs = load_examples(config.data)
    model, tokenizer = _load(config.model, ctx)
    if config.layers == [] and config.layer_groups:  # only the multi-layer settings
        layers = []
    else:
        layers = check_layers(model, config.layers or _default_layers(num_layers(model), 3))
    groups = [[layer] for layer in layers] + [check_layers(model, group) for group in config.layer_groups]
    read = sorted({layer for group in groups for layer in group})
    acts_u = read_activations(model, tokenizer, undesired, read, config.position, config.batch_size, ctx.device)
    acts_n = read_activations(model, tokenizer, neutral, read, config.position, config.batch_size, ctx.device)
    evaluator = _Evaluator(config, model, tokenizer, ctx)
    rows = []
    grid = [(m, group, a) for m in config.methods for group in groups for a in config.alphas]
    for method, group, alpha in ctx.progress(grid, total=len(grid), description="sweep"):
        edits, thresholds, stability = [], [], []
        for layer in group:
            sel_u, sel_n = _method_inputs(method, acts_u[layer], acts_n[layer], n_pairs)
            direction = estimate(method, sel_u, sel_n, config.pair_index)
            if config.unit_norm:
                direction = direction / direction.norm().clamp_min(1e-12)
            edits.append((layer, direction))
            thresholds.append(clip_threshold(direction, sel_n))
            stability.append(split_half_cosine(method, sel_u, sel_n, config.split_repeats, ctx.seed))
        with steering(model, edits, alpha, config.operator, thresholds):
            scores = evaluator.row(evaluator.measure())
        rows.append({"method": method, "layer": group[0] if len(group) == 1 else "+".join(map(str, group)),
                     "alpha": alpha, "operator": config.operator,
                     "direction_norm": sum(float(v.norm()) for _, v in edits) / len(edits),
                     "split_half_cosine": sum(stability) / len(stability), **scores})
    base = {k: v for k, v in evaluator.base.items() if k in ("category_prob", "lexicon_mass", "lexicon_rate", "ppl")}
    write_json(ctx.path("results.json"), {"baseline": base, "rows": rows})
    plot_sweep(rows, ctx.path("sweep.png"))
    ctx.baselines.update({"unsteered": base})
    ctx.metrics.update({"settings": len(rows), "judge_train_accuracy": evaluator.judge_train_acc,
                        "lexicon_tokens": len(evaluator.lexicon_ids), "best": _best(rows)})
    return ctx.metrics


def _best(rows: list[dict], max_kl: float = 0.05) -> dict:
    """Per method, the largest category drop among settings with neutral KL <= max_kl."""
    best = {}
    for row in rows:
        if row["neutral_kl"] <= max_kl and row["category_prob_drop"] > best.get(row["method"], {}).get("drop", -1e9):
            best[row["method"]] = {"drop": row["category_prob_drop"], "layer": row["layer"], "alpha": row["alpha"],
                                   "neutral_kl": row["neutral_kl"]}
    return best


def plot_sweep(rows: list[dict], path) -> None:
    """One column per layer: category-probability drop (top) and neutral KL (bottom) against alpha, per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({str(r["layer"]) for r in rows}, key=lambda key: [int(k) for k in key.split("+")])
    methods = sorted({r["method"] for r in rows})
    fig, axes = plt.subplots(2, len(layers), figsize=(4 * len(layers), 6), squeeze=False)
    for col, layer in enumerate(layers):
        for method in methods:
            sel = sorted((r for r in rows if str(r["layer"]) == layer and r["method"] == method), key=lambda r: r["alpha"])
            alphas = [r["alpha"] for r in sel]
            axes[0][col].plot(alphas, [r["category_prob_drop"] for r in sel], marker="o", label=method.upper())
            axes[1][col].plot(alphas, [r["neutral_kl"] for r in sel], marker="o", label=method.upper())
        axes[0][col].set_title(f"layer {layer}")
        axes[0][col].axhline(0.5, color="grey", lw=0.5, ls="--")
        axes[1][col].axhline(0.05, color="grey", lw=0.5, ls="--")
        axes[1][col].set_xlabel("alpha")
        axes[1][col].set_yscale("symlog", linthresh=0.01)
    axes[0][0].set_ylabel("category prob drop")
    axes[1][0].set_ylabel("neutral KL (nats)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
