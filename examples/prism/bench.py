"""PRISM benchmark at CPU scale: memorise a small MUSE-News subset, unlearn it with GA / NPO / RMU / PRISM, evaluate,
attack (relearning, jailbreak prefixes, embedding perturbation) and write runs/repro-prism/results.json."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from toolkit.core.context import RunContext
from toolkit.models.save import save_model
from toolkit.models.source import load_model
from toolkit.unlearn.baselines import GaConfig, NpoConfig, RmuConfig, run_ga, run_npo, run_rmu
from toolkit.unlearn.data import encode_documents, pad_id, qa_text
from toolkit.unlearn.evaluate import EvalConfig, RelearnConfig, evaluate, relearn
from toolkit.unlearn.prism import PrismConfig, run_prism
from toolkit.unlearn.train import finetune

MUSE = Path("../shared/data/muse-news")


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
    retain_qa = json.loads((MUSE / "knowmem/retain2_qa.json").read_text())[:args.qa]
    verbmem = []
    for doc in forget_docs:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        verbmem.append({"prompt": tokenizer.decode(ids[:args.prompt_tokens]),
                        "gt": tokenizer.decode(ids[args.prompt_tokens:args.prompt_tokens + args.gt_tokens])})
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
    settings = {k: getattr(args, k) for k in ("model", "docs", "qa", "doc_tokens", "memorise_steps", "memorise_lr")}
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
            "prompt_tokens": args.prompt_tokens, "embed_steps": args.embed_steps, "jailbreak": full}
    if full:
        base.update({"holdout": paths["holdout"], "mia_forget": paths["forget_articles"],
                     "retain": paths["retain_articles"], "max_length": args.doc_tokens})
    return base


def unlearn(method: str, memorised: str, paths: dict, args, folder: Path) -> str:
    common = {"model": memorised, "forget": paths["forget"], "retain": paths["retain"], "max_length": args.doc_tokens,
              "batch_size": 4, "lr": args.lr, "epochs": args.epochs}
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
    out = folder / method.replace(" ", "_").replace("/", "")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = RunContext(device="cpu", seed=0, out=out, quiet=True)
    run(config, ctx)
    (out / "metrics.json").write_text(json.dumps({k: v for k, v in ctx.metrics.items() if k != "loss_history"},
                                                 indent=1))
    return str(out / "model")


def measure(name: str, model_dir: str, paths: dict, args, reference_auc: float, attack: bool = True) -> dict:
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
    attack = RelearnConfig(**eval_config(model_dir, paths, args, False), forget=paths["forget"],
                           fraction=args.relearn_fraction, steps=args.relearn_steps, lr=args.relearn_lr,
                           batch_size=4, train_length=args.doc_tokens)
    relearn(model, tokenizer, attack, 0, "cpu")
    after = evaluate(model, tokenizer, EvalConfig(**eval_config(model_dir, paths, args, False)), "cpu")
    return {**row, "verbmem_after_relearn": after["verbmem_forget"], "knowmem_after_relearn": after["knowmem_forget"]}


def stage(message: str, clock: float) -> None:
    print(f"[{time.perf_counter() - clock:7.1f}s] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="zoo:gpt2-small")
    parser.add_argument("--out", default="runs/repro-prism")
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--qa", type=int, default=4)
    parser.add_argument("--doc-tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gt-tokens", type=int, default=32)
    parser.add_argument("--memorise-steps", type=int, default=120)
    parser.add_argument("--memorise-lr", type=float, default=2e-3)
    parser.add_argument("--lr", type=float, default=5e-4)
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
    parser.add_argument("--methods", default="NPO,PRISM,GA,RMU")
    args = parser.parse_args()
    torch.set_num_threads(2)
    clock = time.perf_counter()
    out = Path(args.out)
    work = out / "work"
    paths = build_data(load_model(args.model)[1], args, work / "data")
    memorised, memo_stats = memorise(args, paths, work / "memorised")
    stage(f"memorised: {memo_stats}", clock)
    base_model, tokenizer = load_model(args.model)
    reference = evaluate(base_model, tokenizer, EvalConfig(**{**eval_config(args.model, paths, args, True),
                                                              "jailbreak": False}), "cpu")["mia_auc"]
    rows = [measure("original", memorised, paths, args, reference, attack=False)]
    stage(json.dumps(rows[-1]), clock)
    for method in args.methods.split(","):
        started = time.perf_counter()
        rows.append({**measure(method, unlearn(method, memorised, paths, args, work), paths, args, reference),
                     "seconds": time.perf_counter() - started})
        stage(json.dumps(rows[-1]), clock)
        result = {"rows": rows, "reference_auc": reference, "setup": {**vars(args), **memo_stats},
                  "wall_seconds": time.perf_counter() - clock}
        (out / "results.json").write_text(json.dumps(result, indent=1))  # after every method: partial runs count
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
