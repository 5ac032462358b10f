"""Gather the repro's rows into runs/repro-deeprag/results.json and print the table."""

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


extra = {"setup": read(out / "setup" / "setup.json"), "synth": read(out / "synth" / "run.json", "metrics"),
         "train": read(out / "trained" / "run.json", "metrics")}
(out / "results.json").write_text(json.dumps({"rows": rows, **extra}, indent=2))
print(f"{'dataset':<14} {'method':<16} {'EM':>6} {'F1':>6} {'retr/q':>7} {'n':>4}")
for row in rows:
    print(f"{row['dataset']:<14} {row['method']:<16} {row['em']:6.3f} {row['f1']:6.3f} "
          f"{row['retrievals_per_question']:7.2f} {row['questions']:4d}")
