"""SST-2 (shared/data/sst2/dev.tsv) as MHLP question/answer JSONL: a balanced random subset, answers
"positive"/"negative"."""

import argparse
import csv
import json
from pathlib import Path

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("--tsv", type=Path, default=Path("../shared/data/sst2/dev.tsv"))
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--per-class", type=int, default=20)
args = parser.parse_args()
with open(args.tsv) as f:
    rows = list(csv.DictReader(f, delimiter="\t"))
rng = np.random.default_rng(0)
chosen = []
for label, name in (("0", "negative"), ("1", "positive")):
    pool = [r for r in rows if r["label"] == label]
    chosen += [{"question": f"Review: {pool[i]['text'].strip()}\nIs the sentiment of this review positive or "
                            "negative?", "answer": name}
               for i in rng.choice(len(pool), args.per_class, replace=False)]
order = rng.permutation(len(chosen))
args.out.parent.mkdir(parents=True, exist_ok=True)
args.out.write_text("".join(json.dumps(chosen[i]) + "\n" for i in order))
