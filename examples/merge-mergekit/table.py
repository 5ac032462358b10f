"""Print results.json as the Markdown table of README.md: python examples/merge-mergekit/table.py [results.json]"""

import json
import sys
from pathlib import Path

rows = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("results.json")).read_text())["rows"]
print("| method | case | dtype | numerics | max abs diff vs mergekit | values differing | byte-identical |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['method']} | {r['case']} | {r['dtype']} | {r['numerics']} | {r['max_abs_diff']:.3g} | "
          f"{100 * r['differing_fraction']:.2f} % | {'yes' if r['byte_identical'] else 'no'} |")
print()
print(f"commit {rows[0]['commit']}, mergekit {rows[0]['mergekit']}; per row: `{rows[0]['command']}`")
