"""Pick the training configuration on the validation questions (never the test ones): the highest DeepRAG EM on
OUT/val-*/results.json, ties broken by fewer retrievals per question, then by the name. Prints the chosen name and
writes OUT/selection.json with every candidate's validation figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
candidates = {}
for results in sorted(out.glob("val-*/results.json")):
    rows = {row["method"]: row for row in json.loads(results.read_text())["rows"]}
    candidates[results.parent.name[len("val-"):]] = rows
if not candidates:
    sys.exit(f"no validation results under {out}/val-*")
chosen = min(candidates, key=lambda name: (-candidates[name]["deeprag"]["em"],
                                           candidates[name]["deeprag"]["retrievals_per_question"], name))
(out / "selection.json").write_text(json.dumps({"chosen": chosen, "rule": "max val DeepRAG EM, then fewer "
                                                "retrievals, then name", "val": candidates}, indent=2))
print(chosen)
