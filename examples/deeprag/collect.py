"""Gather the repro's rows into runs/repro-deeprag/results.json and print the table. `rows` holds the test rows of
the configuration chosen on validation questions (eval-kb) and the real-data rows; `candidates` holds every
training configuration's validation and test figures, so nothing tried is hidden."""

from __future__ import annotations

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for evaluation in sorted(out.glob("eval-*/results.json")):
    rows += json.loads(evaluation.read_text())["rows"]


def read(path: Path, key: str | None = None) -> dict:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return data[key] if key else data


def figures(path: Path) -> dict:
    return {row["method"]: {k: row[k] for k in ("em", "f1", "retrievals_per_question", "questions")}
            for row in read(path).get("rows", [])}


selection = read(out / "selection.json")
candidates = {}
for trained in sorted((out / "cand").glob("*/run.json")):
    name = trained.parent.name
    test = out / ("eval-kb" if name == selection.get("chosen") else f"test-{name}") / "results.json"
    candidates[name] = {"train": read(trained, "metrics"), "val": figures(out / f"val-{name}" / "results.json"),
                        "test": figures(test)}
extra = {"setup": read(out / "setup" / "setup.json"), "chosen": selection.get("chosen"),
         "selection_rule": selection.get("rule"), "candidates": candidates,
         "synth": {path.parent.name: read(path, "metrics") for path in sorted(out.glob("synth-*/run.json"))}}
(out / "results.json").write_text(json.dumps({"rows": rows, **extra}, indent=2))
print(f"{'dataset':<14} {'method':<16} {'EM':>6} {'F1':>6} {'retr/q':>7} {'n':>4}")
for row in rows:
    print(f"{row['dataset']:<14} {row['method']:<16} {row['em']:6.3f} {row['f1']:6.3f} "
          f"{row['retrievals_per_question']:7.2f} {row['questions']:4d}")
if candidates:
    print(f"\nchosen on validation: {selection.get('chosen')}")
    print(f"{'candidate':<28} {'val DR EM/retr':>15} {'val always':>11} {'test DR EM/retr':>16} {'test always':>12}")
    for name, c in candidates.items():
        def cell(split, method):
            row = c[split].get(method)
            return f"{row['em']:.3f}/{row['retrievals_per_question']:.2f}" if row else "-"
        print(f"{name:<28} {cell('val', 'deeprag'):>15} {cell('val', 'always-retrieve'):>11} "
              f"{cell('test', 'deeprag'):>16} {cell('test', 'always-retrieve'):>12}")
