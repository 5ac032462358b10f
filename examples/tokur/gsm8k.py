"""TokUR on GSM8K with zoo:smollm2-135m: AUROC of each uncertainty vs answer correctness, best-of-N selection.

    python examples/tokur/gsm8k.py [--subset easy|all | --max-steps K] [--questions 200] [--candidates 4]
                                   [--max-new-tokens 128] [--strict-judge] [--budget-s 1200] [--out runs/tokur-gsm8k]

Data: $ICLRKIT_DATA/gsm8k/test.jsonl (default ../shared/data beside the project). `--subset easy` keeps the questions
whose reference solution has at most one calculator step (`<<…>>`; 83 of 1,319), for a model that solves almost
none of the others. The subset's last 8 questions are the σ anchors (≤ 1 % answer-NLL rule) and are not evaluated.
`--max-steps K` (instead of --subset) evaluates the questions with at most K steps, easiest first (fewest steps, then
shortest reference solution, then file order), with the same 8 anchors as `--subset easy` (so the same σ), which are
left out: ≤ 2 steps gives 432 questions besides the anchors.
σ is found once (a one-question run) and kept in OUT/sigma.json, reused by a later run into the same OUT when the
model, rank, prompt and anchors are the same; then the evaluation runs with that σ and stops after `--budget-s`
seconds of wall time; whatever finished in responses.jsonl is scored (each question complete with its N candidates).
The candidates of `--generate-batch` questions are sampled in one generate call (each question keeps its seed).
Correctness: the math-equivalence judge of toolkit.uq.math_answer (math-verify) against the "#### N" answer;
`--strict-judge` credits only an explicitly marked answer ("The answer is", "####", \\boxed{}), no last-number
fallback. Scoring always re-reads and re-judges the stored responses with the current judge, so `--score-only`
(with or without `--strict-judge`) re-scores an earlier run; the judge's counts land in results.json (`judge`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
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
    return [r for r in records if steps(r) <= 1] if which == "easy" else list(records)


def steps(record: dict) -> int:
    """Calculator steps (`<<…>>` annotations) of a reference solution."""
    return record["answer"].count("<<")


def select(records: list[dict], which: str, max_steps: int | None, questions: int) -> tuple[list[dict], list[dict]]:
    """(σ anchors, evaluated questions). Without max_steps: the subset's last N_ANCHORS records are the anchors and
    the first `questions` of the rest are evaluated, in file order. With max_steps: the anchors of the easy subset
    (the same σ), and the `questions` easiest records of at most max_steps steps besides them (fewest steps, then
    shortest solution, then file order)."""
    if max_steps is None:
        chosen = subset(records, which)
        return chosen[-N_ANCHORS:], chosen[:-N_ANCHORS][:questions]
    anchors = subset(records, "easy")[-N_ANCHORS:]
    anchor_ids = {id(r) for r in anchors}
    pool = [(steps(r), len(r["answer"]), i, r) for i, r in enumerate(records)
            if steps(r) <= max_steps and id(r) not in anchor_ids]
    return anchors, [r for *_, r in sorted(pool, key=lambda t: t[:3])][:questions]


def score(out: Path, candidates: int, strict: bool = False, responses: Path | None = None) -> dict:
    """Metrics of the complete questions in out/responses.jsonl (or `responses`), each response re-read and
    re-judged by the current judge; strict: marked answers only."""
    sys.path.insert(0, str(ROOT))
    from toolkit.eval.metrics import auroc
    from toolkit.uq.math_answer import JudgeStats, equivalent, marked_final, predicted_final
    from toolkit.uq.run import majority_vote_accuracy, selection_rows

    if not out.is_dir():  # a run stopped by the budget leaves its outputs in RUN.partial
        out = out.with_name(out.name + ".partial")
    path = responses or out / "responses.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    judge = JudgeStats()
    for record in records:  # strict: no answer marker, no answer (the last-number fallback credits "…5. 6.")
        record["final"] = (marked_final if strict else predicted_final)(record["response"])
        record["correct"] = equivalent(record["final"], record["reference"], judge)
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
                                                                                       for q in complete], judge)})
    means = {name: {"right": float(np.mean([r[name] for r in flat if r["correct"]])) if (~errors).any() else None,
                    "wrong": float(np.mean([r[name] for r in flat if not r["correct"]])) if errors.any() else None}
             for name in names}
    return {"n_questions": len(complete), "n_responses": len(flat), "n_correct": int((~errors).sum()),
            "accuracy": round(float(correct.mean()), 4) if len(flat) else None, "auroc_by_score": aurocs,
            "rows": [{**row, "accuracy": round(row["accuracy"], 4), "method": row["selection"]} for row in rows],
            "mean_uncertainty": means, "answered": sum(r["final"] is not None for r in flat),
            "judge": judge.as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subset", choices=("easy", "all"), default="easy")
    parser.add_argument("--max-steps", type=int, help="evaluate the questions with at most K calculator steps, "
                        "easiest first (replaces --subset; anchors as --subset easy)")
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
    parser.add_argument("--responses", type=Path, help="with --score-only: score this responses.jsonl (e.g. the "
                        "committed examples/tokur/responses-gsm8k-48.jsonl) instead of OUT/run's; pass the run's "
                        "--temperature, --max-new-tokens and --candidates")
    parser.add_argument("--strict-judge", action="store_true", help="credit only explicitly marked answers "
                        "(\"The answer is\", \"####\", \\boxed{}), no last-number fallback")
    parser.add_argument("--generate-batch", type=int, default=16, help="questions sampled in one generate call "
                        "(CPU speed; the responses of each question keep its seed)")
    args = parser.parse_args()
    out = args.out
    cpu = {}
    if not args.score_only:
        out.mkdir(parents=True, exist_ok=True)
        records = [json.loads(line) for line in (DATA / "gsm8k/test.jsonl").read_text().splitlines()]
        anchors, evaluated = select(records, args.subset, args.max_steps, args.questions)
        (out / "anchors.jsonl").write_text("".join(json.dumps(r) + "\n" for r in anchors))
        (out / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evaluated))
        import yaml

        config = {"prompt_template": PROMPT, "temperature": args.temperature, "generate_batch": args.generate_batch}
        (out / "config.yaml").write_text(yaml.safe_dump(config))  # newlines and colons: a file, not --set
        base = [sys.executable, "-m", "cli.main", "-q", "uq", "tokur", "-m", args.model, "--candidates",
                str(args.candidates), "--samples", "5", "--rank", "8", "--max-new-tokens", str(args.max_new_tokens),
                "--config", str(out / "config.yaml"), "--overwrite", "--json"]
        key = sigma_key(args.model, out)
        if args.sigma_from:
            (out / "sigma.json").write_text(args.sigma_from.read_text())
        elif (out / "sigma.json").is_file() and json.loads((out / "sigma.json").read_text()).get("key") == key:
            print(f"σ from {out / 'sigma.json'} (same model, rank, prompt and anchors)", file=sys.stderr)
        else:
            before = children_cpu_s()
            find_sigma(base, out, key)
            cpu["sigma_search"] = round(children_cpu_s() - before, 1)
        sigma = json.loads((out / "sigma.json").read_text())["sigma"]
        before = children_cpu_s()
        try:
            done = subprocess.run(base + ["-d", str(out / "questions.jsonl"), "--sigma", str(sigma),
                                          "-o", str(out / "run")], capture_output=True, text=True,
                                  timeout=args.budget_s)
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
        except subprocess.TimeoutExpired:
            print(f"stopped after {args.budget_s:.0f} s: scoring the questions that finished", file=sys.stderr)
        cpu["evaluation"] = round(children_cpu_s() - before, 1)  # CPU s of the evaluation process (load included)
    sigma = json.loads((out / "sigma.json").read_text())["sigma"] if (out / "sigma.json").is_file() else None
    if args.score_only:  # the sampling settings are the run's own, not this invocation's defaults
        args.temperature, args.max_new_tokens, args.candidates = run_settings(out, args)
    result = {"model": args.model, "subset": args.subset if args.max_steps is None else None,
              "max_steps": args.max_steps, "strict_judge": args.strict_judge, "candidates": args.candidates,
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "sigma": sigma,
              **score(out / "run", args.candidates, args.strict_judge, args.responses)}
    if cpu:
        result["cpu_s"] = cpu
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def run_settings(out: Path, args) -> tuple[float, int, int]:
    """(temperature, max new tokens, candidates) of the run in `out` (its config.yaml and run/run.json), else the
    command line's."""
    import yaml

    temperature, max_new, candidates = args.temperature, args.max_new_tokens, args.candidates
    if (out / "config.yaml").is_file():
        temperature = yaml.safe_load((out / "config.yaml").read_text()).get("temperature", temperature)
    if (out / "run" / "run.json").is_file():
        config = json.loads((out / "run" / "run.json").read_text()).get("config", {})
        max_new, candidates = config.get("max_new_tokens", max_new), config.get("candidates", candidates)
    return temperature, max_new, candidates


def find_sigma(base: list[str], out: Path, key: dict) -> None:
    """σ by the ≤ 1 % rule on the anchors, from a one-question, one-token run."""
    probe = subprocess.run(base + ["-d", str(out / "questions.jsonl"), "--limit", "1", "--candidates", "1",
                                   "--max-new-tokens", "1", "--set", f"anchor_data={out / 'anchors.jsonl'}",
                                   "-o", str(out / "sigma")], capture_output=True, text=True, check=True)
    metrics = json.loads(probe.stdout)["metrics"]
    (out / "sigma.json").write_text(json.dumps({"sigma": metrics["sigma"], "search": metrics["sigma_search"],
                                                "key": key}))


def sigma_key(model: str, out: Path) -> dict:
    """What σ depends on here (the search's threshold, steps, draws and seed are the command's defaults)."""
    return {"model": model, "rank": 8, "prompt_template": PROMPT,
            "anchors_sha256": hashlib.sha256((out / "anchors.jsonl").read_bytes()).hexdigest()}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
