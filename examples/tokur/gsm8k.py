"""TokUR on GSM8K with zoo:smollm2-135m: AUROC of each uncertainty vs answer correctness, best-of-N selection.

    python examples/tokur/gsm8k.py [--subset easy|all] [--questions 200] [--candidates 4] [--max-new-tokens 128]
                                   [--budget-s 1200] [--out runs/tokur-gsm8k]

Data: $ICLRKIT_DATA/gsm8k/test.jsonl (default ../shared/data beside the project). `--subset easy` keeps the questions
whose reference solution has at most one calculator step (`<<…>>`; 83 of 1,319), for a model that solves almost
none of the others. The subset's last 8 questions are the σ anchors (≤ 1 % answer-NLL rule) and are not evaluated.
σ is found once (a one-question run), then the evaluation runs with that σ and stops after `--budget-s` seconds of
wall time; whatever finished in responses.jsonl is scored (each question complete with its N candidates).
Correctness: the math-equivalence judge of toolkit.uq.math_answer against the "#### N" answer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("ICLRKIT_DATA", ROOT.parent / "shared" / "data"))
PROMPT = ("<|im_start|>user\n{question}\nSolve it step by step and end with \"The answer is: N\".<|im_end|>\n"
          "<|im_start|>assistant\n")
N_ANCHORS = 8


def subset(records: list[dict], which: str) -> list[dict]:
    return [r for r in records if r["answer"].count("<<") <= 1] if which == "easy" else list(records)


def score(out: Path, candidates: int) -> dict:
    """Metrics of the complete questions in responses.jsonl."""
    sys.path.insert(0, str(ROOT))
    from toolkit.eval.metrics import auroc
    from toolkit.uq.run import majority_vote_accuracy, selection_rows

    if not out.is_dir():  # a run stopped by the budget leaves its outputs in RUN.partial
        out = out.with_name(out.name + ".partial")
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines() if line.strip()]
    by_question: dict[int, list[dict]] = {}
    for record in records:
        by_question.setdefault(record["question"], []).append(record)
    complete = [sorted(v, key=lambda r: r["candidate"]) for _, v in sorted(by_question.items())
                if len(v) == candidates]
    flat = [r for q in complete for r in q]
    correct = np.array([[r["correct"] for r in q] for q in complete])
    errors = ~correct.ravel()
    names = ("total", "aleatoric", "epistemic")
    aurocs = ({name: round(float(auroc([r[name] for r in flat], errors)), 4) for name in names}
              if errors.any() and (~errors).any() else {})
    rows = []
    for name in names:
        values = np.array([[r[name] for r in q] for q in complete])
        rows += [{**row, "selection": f"tokur-{name}"} for row in selection_rows(correct, values)[:1]]
    rows += selection_rows(correct, np.zeros(correct.shape))[1:]
    rows.append({"selection": "majority", "accuracy": majority_vote_accuracy(correct, [[r["final"] for r in q]
                                                                                       for q in complete])})
    means = {name: {"right": float(np.mean([r[name] for r in flat if r["correct"]])) if (~errors).any() else None,
                    "wrong": float(np.mean([r[name] for r in flat if not r["correct"]])) if errors.any() else None}
             for name in names}
    return {"n_questions": len(complete), "n_responses": len(flat), "n_correct": int((~errors).sum()),
            "accuracy": round(float(correct.mean()), 4) if len(flat) else None, "auroc_by_score": aurocs,
            "rows": [{**row, "accuracy": round(row["accuracy"], 4), "method": row["selection"]} for row in rows],
            "mean_uncertainty": means, "answered": sum(r["final"] is not None for r in flat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", choices=("easy", "all"), default="easy")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=1200)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sigma-from", type=Path, help="sigma.json of an earlier run on the same anchors (σ does "
                        "not depend on the sampling temperature): skip the σ search")
    parser.add_argument("--model", default="zoo:smollm2-135m")
    parser.add_argument("--out", type=Path, default=Path("runs/tokur-gsm8k"))
    parser.add_argument("--score-only", action="store_true", help="only score an earlier run's responses.jsonl")
    args = parser.parse_args()
    out = args.out
    if not args.score_only:
        out.mkdir(parents=True, exist_ok=True)
        records = subset([json.loads(line) for line in (DATA / "gsm8k/test.jsonl").read_text().splitlines()],
                         args.subset)
        anchors, evaluated = records[-N_ANCHORS:], records[:-N_ANCHORS][:args.questions]
        (out / "anchors.jsonl").write_text("".join(json.dumps(r) + "\n" for r in anchors))
        (out / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evaluated))
        import yaml

        config = {"prompt_template": PROMPT, "temperature": args.temperature}
        (out / "config.yaml").write_text(yaml.safe_dump(config))  # newlines and colons: a file, not --set
        base = [sys.executable, "-m", "cli.main", "-q", "uq", "tokur", "-m", args.model, "--candidates",
                str(args.candidates), "--samples", "5", "--rank", "8", "--max-new-tokens", str(args.max_new_tokens),
                "--config", str(out / "config.yaml"), "--overwrite", "--json"]
        if args.sigma_from:
            (out / "sigma.json").write_text(args.sigma_from.read_text())
        else:
            find_sigma(base, out)
        sigma = json.loads((out / "sigma.json").read_text())["sigma"]
        try:
            subprocess.run(base + ["-d", str(out / "questions.jsonl"), "--sigma", str(sigma), "-o", str(out / "run")],
                           capture_output=True, text=True, timeout=args.budget_s)
        except subprocess.TimeoutExpired:
            print(f"stopped after {args.budget_s:.0f} s: scoring the questions that finished", file=sys.stderr)
    sigma = json.loads((out / "sigma.json").read_text())["sigma"]
    result = {"model": args.model, "subset": args.subset, "candidates": args.candidates,
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "sigma": sigma,
              **score(out / "run", args.candidates)}
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def find_sigma(base: list[str], out: Path) -> None:
    """σ by the ≤ 1 % rule on the anchors, from a one-question, one-token run."""
    probe = subprocess.run(base + ["-d", str(out / "questions.jsonl"), "--limit", "1", "--candidates", "1",
                                   "--max-new-tokens", "1", "--set", f"anchor_data={out / 'anchors.jsonl'}",
                                   "-o", str(out / "sigma")], capture_output=True, text=True, check=True)
    metrics = json.loads(probe.stdout)["metrics"]
    (out / "sigma.json").write_text(json.dumps({"sigma": metrics["sigma"], "search": metrics["sigma_search"]}))


if __name__ == "__main__":
    main()
