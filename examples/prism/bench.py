"""PRISM benchmark at CPU scale: memorise a small MUSE-News subset, unlearn it with GA / NPO / RMU / PRISM, evaluate,
attack (relearning, jailbreak prefixes, embedding perturbation) and write runs/repro-prism/results.json."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from toolkit.core.context import RunContext
from toolkit.models.save import save_model
from toolkit.models.source import load_model
from toolkit.unlearn.baselines import GaConfig, NpoConfig, RmuConfig, run_ga, run_npo, run_rmu
from toolkit.unlearn.data import encode_documents, load_pairs, pad_id, qa_text
from toolkit.unlearn.evaluate import EvalConfig, RelearnConfig, evaluate, knowmem, relearn, verbmem
from toolkit.unlearn.prism import PrismConfig, run_prism
from toolkit.unlearn.train import finetune

MUSE = Path("../shared/data/muse-news")


def verbmem_windows(tokenizer, docs: list[str], prompt_tokens: int, gt_tokens: int, stride: int) -> list[dict]:
    """Several VerbMem items per forget article, so one item no longer moves the mean by 25 points: the article's
    first `prompt_tokens` + k·`stride` tokens as prompt, the next `gt_tokens` as continuation (every prompt starts
    at the article's start, where the memorised text sits), each tagged with its article's index."""
    items = []
    for article, doc in enumerate(docs):
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        for cut in range(prompt_tokens, len(ids) - gt_tokens + 1, stride):
            items.append({"prompt": tokenizer.decode(ids[:cut]), "gt": tokenizer.decode(ids[cut:cut + gt_tokens]),
                          "article": article})
    return items


def build_data(tokenizer, args, folder: Path) -> dict:
    """Token-exact windows of forget / retain / holdout articles, VerbMem prompts cut from the forget windows,
    and QA pairs written into the forget / retain training text so KnowMem measures memorised answers."""
    def windows(texts, n):
        out = []
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= args.doc_tokens:
                out.append(tokenizer.decode(ids[:args.doc_tokens]))
            if len(out) == n:
                return out
        raise SystemExit("not enough long documents")

    verbmem_src = json.loads((MUSE / "verbmem/forget.json").read_text())
    forget_docs = windows([r["prompt"][-3000:] for r in verbmem_src], args.docs)
    retain_docs = windows(json.loads((MUSE / "privleak/retain2.json").read_text()), args.docs)
    holdout_docs = windows(json.loads((MUSE / "privleak/holdout.json").read_text()), args.docs)
    forget_qa = json.loads((MUSE / "knowmem/forget_qa.json").read_text())[:args.qa]
    retain_qa = json.loads((MUSE / "knowmem/retain2_qa.json").read_text())[:args.retain_qa]
    verbmem = verbmem_windows(tokenizer, forget_docs, args.prompt_tokens, args.gt_tokens, args.verbmem_stride)
    files = {"forget": forget_docs + [qa_text(r["question"], r["answer"]) for r in forget_qa],
             "retain": retain_docs + [qa_text(r["question"], r["answer"]) for r in retain_qa],
             "forget_articles": forget_docs, "retain_articles": retain_docs, "holdout": holdout_docs,
             "verbmem": verbmem, "forget_qa": forget_qa, "retain_qa": retain_qa}
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=1))
    return {name: str(folder / f"{name}.json") for name in files}


def memorise(args, paths, folder: Path) -> tuple[str, dict]:
    """Fine-tune until the forget and retain text is memorised; reused when an earlier run had the same settings."""
    settings = {k: getattr(args, k) for k in ("model", "docs", "qa", "retain_qa", "doc_tokens", "memorise_steps",
                                             "memorise_lr")}
    stamp = folder / "settings.json"
    if stamp.exists() and json.loads(stamp.read_text())["settings"] == settings:
        return str(folder), {**json.loads(stamp.read_text())["stats"], "reused": True}
    model, tokenizer = load_model(args.model)
    docs = json.loads(Path(paths["forget"]).read_text()) + json.loads(Path(paths["retain"]).read_text())
    chunks = encode_documents(tokenizer, docs, args.doc_tokens)
    losses = finetune(model, chunks, pad_id(tokenizer), args.memorise_steps, args.memorise_lr, 4, 0, "cpu")
    save_model(model, tokenizer, folder, technique="memorise", source=args.model)
    stats = {"memorise_first_loss": losses[0], "memorise_last_loss": losses[-1],
             "train_tokens": sum(c.numel() for c in chunks)}
    stamp.write_text(json.dumps({"settings": settings, "stats": stats}))
    return str(folder), stats


def eval_config(model: str, paths: dict, args, full: bool) -> dict:
    base = {"model": model, "verbmem": paths["verbmem"], "forget_qa": paths["forget_qa"],
            "retain_qa": paths["retain_qa"], "verbmem_new_tokens": args.gt_tokens, "qa_new_tokens": 16,
            "prompt_tokens": args.doc_tokens, "embed_steps": args.embed_steps, "jailbreak": full}
    if full:
        base.update({"holdout": paths["holdout"], "mia_forget": paths["forget_articles"],
                     "retain": paths["retain_articles"], "max_length": args.doc_tokens})
    return base


def unlearn(method: str, memorised: str, paths: dict, args, folder: Path, lr: float, seed: int) -> str:
    """Unlearn with `method` at learning rate `lr` (GA and RMU keep their own) and seed `seed`; returns the model."""
    common = {"model": memorised, "forget": paths["forget"], "retain": paths["retain"], "max_length": args.doc_tokens,
              "batch_size": 4, "lr": lr, "epochs": args.epochs}
    configs = {
        "GA": (GaConfig(**{**common, "lr": args.ga_lr, "retain_coeff": 1.0}), run_ga),
        "NPO": (NpoConfig(**common), run_npo),
        "RMU": (RmuConfig(**{**common, "lr": args.rmu_lr, "steering_coeff": args.rmu_steering,
                             "alpha": args.rmu_alpha}), run_rmu),
        "PRISM": (PrismConfig(**common, **args.prism), run_prism),
        "PRISM w/o SAM": (PrismConfig(**common, **{**args.prism, "sam_rho": 0.0}), run_prism),
        "PRISM w/o projection": (PrismConfig(**common, **{**args.prism, "project": False}), run_prism),
        "PRISM w/o probe": (PrismConfig(**common, **{**args.prism, "adv_gamma": 0.0}), run_prism),
    }
    config, run = configs[method]
    out = folder / f"{method.replace(' ', '_').replace('/', '')}-lr{config.lr:g}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = RunContext(device="cpu", seed=seed, out=out, quiet=True)
    run(config, ctx)
    (out / "metrics.json").write_text(json.dumps({k: v for k, v in ctx.metrics.items() if k != "loss_history"},
                                                 indent=1))
    return str(out / "model")


def utility(model_dir: str, paths: dict, args) -> dict:
    """What the strength is chosen on: retain KnowMem and retain perplexity (forget metrics only recorded)."""
    model, tokenizer = load_model(model_dir)
    config = EvalConfig(**{**eval_config(model_dir, paths, args, False), "retain": paths["retain_articles"],
                           "max_length": args.doc_tokens})
    found = evaluate(model, tokenizer, config, "cpu")
    return {k: found[k] for k in ("knowmem_retain", "utility_ppl", "verbmem_forget", "knowmem_forget")}


def choose(points: list[dict], original_knowmem_retain: float, tolerance: float) -> dict:
    """Matched utility: the strongest setting (largest lr) whose retain KnowMem is at most `tolerance` (relative)
    below the original model's; when none is, the one closest to it (smallest lr among ties), flagged unmatched.
    The relearning metric is never looked at here."""
    floor = (1.0 - tolerance) * original_knowmem_retain
    eligible = [p for p in points if p["knowmem_retain"] >= floor]
    if eligible:
        return {**max(eligible, key=lambda p: p["lr"]), "matched_utility": True}
    return {**max(points, key=lambda p: (p["knowmem_retain"], -p["lr"])), "matched_utility": False}


def measure(name: str, model_dir: str, paths: dict, args, reference_auc: float, seed: int = 0,
            attack: bool = True) -> dict:
    model, tokenizer = load_model(model_dir)
    full = evaluate(model, tokenizer, EvalConfig(**eval_config(model_dir, paths, args, True),
                                                 reference_auc=reference_auc), "cpu")
    row = {"method": name, **{k: full[k] for k in ("verbmem_forget", "knowmem_forget", "knowmem_retain", "privleak",
                                                   "utility_ppl")},
           "verbmem_after_relearn": None, "knowmem_after_relearn": None, "mia_auc": full["mia_auc"],
           "verbmem_jailbreak_prefix": full["verbmem_jailbreak_prefix"],
           "verbmem_embed_attack": full["verbmem_embed_attack"]}
    if not attack:
        return row
    config = RelearnConfig(**eval_config(model_dir, paths, args, False), forget=paths["forget"],
                           fraction=args.relearn_fraction, steps=args.relearn_steps, lr=args.relearn_lr,
                           batch_size=4, train_length=args.doc_tokens)
    relearn(model, tokenizer, config, seed, "cpu")
    return {**row, **after_relearn(model, tokenizer, config, paths)}


def after_relearn(model, tokenizer, config: RelearnConfig, paths: dict) -> dict:
    """VerbMem over all items, and split into the articles the attacker fine-tuned on and those it did not."""
    items = json.loads(Path(paths["verbmem"]).read_text())
    n_attacked = max(1, round(config.fraction * len(json.loads(Path(paths["forget"]).read_text()))))
    scores = verbmem(model, tokenizer, [(r["prompt"], r["gt"]) for r in items], config, "cpu")
    seen = [s for s, r in zip(scores, items) if r["article"] < n_attacked]
    unseen = [s for s, r in zip(scores, items) if r["article"] >= n_attacked]
    qa = load_pairs(paths["forget_qa"], ("question", "answer"))
    return {"verbmem_after_relearn": 100.0 * sum(scores) / len(scores),
            "verbmem_after_relearn_attacked_articles": 100.0 * sum(seen) / len(seen) if seen else None,
            "verbmem_after_relearn_other_articles": 100.0 * sum(unseen) / len(unseen) if unseen else None,
            "knowmem_after_relearn": knowmem(model, tokenizer, qa, [], config, "cpu")}


def mean_row(method: str, runs: list[dict], chosen: dict) -> dict:
    """The method's row at matched utility: per-seed figures averaged, spread of the relearn figure kept."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    row = {"method": method, **{k: statistics.fmean(r[k] for r in runs) for k in keys}}
    relearned = [r["verbmem_after_relearn"] for r in runs]
    return {**row, "verbmem_after_relearn_sd": statistics.stdev(relearned) if len(runs) > 1 else 0.0,
            "verbmem_after_relearn_per_seed": relearned, "seeds": len(runs), "lr": chosen["lr"],
            "matched_utility": chosen["matched_utility"]}


def stage(message: str, clock: float) -> None:
    print(f"[{time.perf_counter() - clock:7.1f}s] {message}", file=sys.stderr, flush=True)


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="zoo:gpt2-small")
    parser.add_argument("--out", default="runs/repro-prism")
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--qa", type=int, default=4, help="Forget QA pairs (KnowMem forget).")
    parser.add_argument("--retain-qa", type=int, default=16, help="Retain QA pairs (KnowMem retain: the utility "
                        "the strength is matched on).")
    parser.add_argument("--doc-tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gt-tokens", type=int, default=32)
    parser.add_argument("--verbmem-stride", type=int, default=8, help="Start a VerbMem window every N tokens.")
    parser.add_argument("--memorise-steps", type=int, default=210)
    parser.add_argument("--memorise-lr", type=float, default=2e-3)
    parser.add_argument("--grid", type=floats, default=floats("1e-4,2e-4,3e-4,5e-4"),
                        help="Shared lr grid of the tuned methods (strength at a fixed step count).")
    parser.add_argument("--match-tolerance", type=float, default=0.05,
                        help="Matched utility: retain KnowMem at most this fraction below the original's.")
    parser.add_argument("--seeds", type=lambda t: [int(x) for x in t.split(",")], default=[0, 1, 2])
    parser.add_argument("--tuned", default="NPO,PRISM", help="Methods tuned on the grid and run on every seed.")
    parser.add_argument("--methods", default="GA,RMU,PRISM w/o SAM,PRISM w/o projection,PRISM w/o probe",
                        help="Extra methods, one run each (seed 0): GA and RMU untuned, the PRISM ablations at "
                        "PRISM's matched lr.")
    parser.add_argument("--ga-lr", type=float, default=5e-4)
    parser.add_argument("--rmu-lr", type=float, default=1e-3)
    parser.add_argument("--rmu-steering", type=float, default=20.0)
    parser.add_argument("--rmu-alpha", type=float, default=100.0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--relearn-steps", type=int, default=15)
    parser.add_argument("--relearn-lr", type=float, default=3e-4)
    parser.add_argument("--relearn-fraction", type=float, default=0.25)
    parser.add_argument("--embed-steps", type=int, default=5)
    parser.add_argument("--prism", type=json.loads, default={"probe_layer": 3, "probe_lr": 1e-3, "probe_epochs": 50,
                                                             "sam_rho": 0.011, "adv_gamma": 0.085})
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine is shared: one thread avoids OpenMP spin-waits under contention
    clock = time.perf_counter()
    out = Path(args.out)
    work = out / "work"
    paths = build_data(load_model(args.model)[1], args, work / "data")
    memorised, memo_stats = memorise(args, paths, work / "memorised")
    stage(f"memorised: {memo_stats}", clock)
    base_model, tokenizer = load_model(args.model)
    reference = evaluate(base_model, tokenizer, EvalConfig(**{**eval_config(args.model, paths, args, True),
                                                              "jailbreak": False}), "cpu")["mia_auc"]
    original = measure("original", memorised, paths, args, reference, attack=False)
    rows, grid, chosen_lr = [original], {}, {}
    setup = {**vars(args), **memo_stats, "verbmem_items": len(json.loads(Path(paths["verbmem"]).read_text()))}

    def save() -> None:  # after every run: partial runs count
        result = {"rows": rows, "grid": grid, "reference_auc": reference, "setup": setup,
                  "wall_seconds": time.perf_counter() - clock}
        (out / "results.json").write_text(json.dumps(result, indent=1))

    stage(json.dumps(original), clock)
    for method in [m for m in args.tuned.split(",") if m]:
        grid[method] = []
        for lr in args.grid:
            model_dir = unlearn(method, memorised, paths, args, work, lr, args.seeds[0])
            grid[method].append({"lr": lr, **utility(model_dir, paths, args), "model": model_dir})
            stage(f"{method} grid {json.dumps(grid[method][-1])}", clock)
            save()
        chosen = choose(grid[method], original["knowmem_retain"], args.match_tolerance)
        chosen_lr[method] = chosen["lr"]
        runs = []
        for seed in args.seeds:
            started = time.perf_counter()
            model_dir = chosen["model"] if seed == args.seeds[0] else \
                unlearn(method, memorised, paths, args, work, chosen["lr"], seed)
            runs.append({**measure(f"{method} seed {seed}", model_dir, paths, args, reference, seed),
                         "seconds": time.perf_counter() - started})
            stage(json.dumps(runs[-1]), clock)
        rows.append(mean_row(method, runs, chosen))
        rows.extend(runs)
        save()
    for method in [m for m in args.methods.split(",") if m]:
        started = time.perf_counter()
        lr = chosen_lr.get("PRISM", args.grid[-1]) if method.startswith("PRISM") else args.grid[-1]
        model_dir = unlearn(method, memorised, paths, args, work, lr, args.seeds[0])
        rows.append({**measure(method, model_dir, paths, args, reference), "seconds": time.perf_counter() - started})
        stage(json.dumps(rows[-1]), clock)
        save()
    print_table(rows)


def print_table(rows) -> None:
    keys = ["verbmem_forget", "knowmem_forget", "knowmem_retain", "privleak", "utility_ppl", "verbmem_after_relearn",
            "knowmem_after_relearn", "verbmem_jailbreak_prefix", "verbmem_embed_attack"]
    print("| method | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for row in rows:
        print(f"| {row['method']} | " + " | ".join("-" if row[k] is None else f"{row[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
