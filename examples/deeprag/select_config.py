"""Choose the headline configuration on the dev split (never the test one), by the rule written in RESULTS.md before
the run: among the paper's method trained with both stages (candidates `paper-dpo-*`: stage I imitation + stage II
chain of calibration at one DPO setting each), the highest DeepRAG EM on dev, ties broken by fewer retrievals per
question on dev, then by the name. Prints the chosen name; writes OUT/selection.json with every candidate's dev rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RULE = ("among paper-dpo-* (paper search + stage I + stage II): max dev DeepRAG EM, then fewer dev retrievals per "
        "question, then name")

out = Path(sys.argv[1])
dev = {}
for results in sorted(out.glob("dev-*/results.json")):
    dev[results.parent.name[len("dev-"):]] = {row["method"]: row for row in json.loads(results.read_text())["rows"]}
headline = {name: rows for name, rows in dev.items() if name.startswith("paper-dpo-") and "deeprag" in rows}
if not headline:
    sys.exit(f"no dev results for a paper-dpo-* candidate under {out}/dev-*")
chosen = min(headline, key=lambda name: (-headline[name]["deeprag"]["em"],
                                         headline[name]["deeprag"]["retrievals_per_question"], name))
(out / "selection.json").write_text(json.dumps({"chosen": chosen, "rule": RULE, "dev": dev}, indent=2))
print(chosen)
