"""Gather the repro's rows into OUT/results.json and print the tables. `rows` (test split of the new-seed KB, then the
real-data rows): the headline "DeepRAG (paper)" (the candidate chosen on dev), the baselines trained on their own
data, then every other candidate and the chosen model forced to always / never retrieve. `candidates` holds every
configuration's training metrics and dev and test figures, `claims` the paper's claim checked on test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
KEYS = ("em", "f1", "retrievals_per_question", "questions")


def read(path: Path, key: str | None = None) -> dict:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return data.get(key, {}) if key else data


def figures(path: Path) -> dict:
    return {row["method"]: {k: row[k] for k in KEYS} for row in read(path).get("rows", [])}


selection = read(out / "selection.json")
chosen = selection.get("chosen")
candidates = {}
for trained in sorted((out / "cand").glob("*/run.json")):
    name = trained.parent.name
    candidates[name] = {"train": read(trained, "metrics"), "dev": figures(out / f"dev-{name}" / "results.json"),
                        "test": figures(out / f"test-{name}" / "results.json")}


def row(method: str, candidate: str, mode: str, note: str) -> dict | None:
    figure = candidates.get(candidate, {}).get("test", {}).get(mode)
    if figure is None:
        return None
    return {"dataset": "synthetic-kb", "method": method, **figure, "candidate": candidate, "inference": mode,
            "split": "test", "note": note}


LABELS = {"paper-sft": "DeepRAG stage I only (paper search, SFT)",
          "evidence-sft": "DeepRAG + evidence check (ours, SFT)",
          "evidence-dpo-b0.4-lr5e-6": "DeepRAG + evidence check (ours, SFT + DPO)"}
rows = []
if chosen:
    rows.append(row("DeepRAG (paper)", chosen, "deeprag", "binary-tree search (min retrievals), model-written "
                    "sub-questions, in-chain parametric answers, [No related Info] reader, stage I + II; "
                    "chosen on dev"))
rows.append(row("always-retrieve (own SFT)", "always-sft", "always-retrieve",
                "trained on its own all-retrieval paths; retrieves after every follow-up"))
rows.append(row("no-retrieval (own SFT)", "never-sft", "no-retrieval",
                "trained on its own all-parametric paths (kept when correct); never retrieves"))
for name in candidates:
    if name in ("always-sft", "never-sft"):
        continue
    if name != chosen:
        label = LABELS.get(name, f"DeepRAG (paper search, {name}; not chosen on dev)")
        rows.append(row(label, name, "deeprag", "candidate, reported for the record"))
if chosen:
    rows.append(row("DeepRAG (paper) model forced to always retrieve", chosen, "always-retrieve", "same model"))
    rows.append(row("DeepRAG (paper) model forced to never retrieve", chosen, "no-retrieval", "same model"))
rows = [r for r in rows if r]
for evaluation in sorted(out.glob("eval-*/results.json")):  # the real-data part
    rows += json.loads(evaluation.read_text())["rows"]

claims = {}
head = next((r for r in rows if r["method"] == "DeepRAG (paper)"), None)
always = next((r for r in rows if r["method"] == "always-retrieve (own SFT)"), None)
if head and always:
    claims["fewer_retrievals_at_no_lower_accuracy"] = {
        "deeprag_em": head["em"], "always_em": always["em"], "deeprag_retrievals": head["retrievals_per_question"],
        "always_retrievals": always["retrievals_per_question"],
        "em_not_lower": head["em"] >= always["em"],
        "fewer_retrievals": head["retrievals_per_question"] < always["retrievals_per_question"],
        "reproduced": head["em"] >= always["em"] and head["retrievals_per_question"] < always["retrievals_per_question"]}
extra = {"setup": read(out / "setup" / "setup.json"), "chosen": chosen, "selection_rule": selection.get("rule"),
         "claims": claims, "candidates": candidates,
         "synth": {path.parent.name: read(path, "metrics") for path in sorted(out.glob("synth-*/run.json"))}}
(out / "results.json").write_text(json.dumps({"rows": rows, **extra}, indent=2))
print(f"{'dataset':<13} {'method':<58} {'EM':>6} {'F1':>6} {'retr/q':>7} {'n':>4}")
for r in rows:
    print(f"{r['dataset']:<13} {r['method']:<58} {r['em']:6.3f} {r['f1']:6.3f} {r['retrievals_per_question']:7.2f} "
          f"{r['questions']:4d}")
if candidates:
    print(f"\nchosen on dev: {chosen}")
    for name, c in candidates.items():
        cells = [f"{split} {m}: {f['em']:.3f}/{f['retrievals_per_question']:.2f}"
                 for split in ("dev", "test") for m, f in c[split].items()]
        print(f"{name:<26} " + " | ".join(cells))
print(json.dumps(claims))
