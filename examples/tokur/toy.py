"""Build the TokUR repro's toy task: a briefly trained character GPT-2 adder, a GSM8K-format question file and a
disjoint anchor file for the σ search."""

import argparse
import json
from pathlib import Path

import torch

from toolkit.uq.toy import addition_items, train_adder

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--questions", type=int, default=60)
parser.add_argument("--anchors", type=int, default=16, help="held-out questions for the σ search")
parser.add_argument("--low", type=int, default=0)
parser.add_argument("--high", type=int, default=49)
parser.add_argument("--init", type=Path, default=None, help="continue training this saved adder")
args = parser.parse_args()
torch.set_num_threads(2)
args.out.mkdir(parents=True, exist_ok=True)
train_adder(args.out / "adder", args.steps, batch=32, low=args.low, high=args.high, init=args.init)
items = addition_items(args.questions, seed=123, low=args.low, high=args.high)
(args.out / "toy.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
# σ is searched on other questions than the evaluated ones
evaluated = {item["question"] for item in items}
anchors = [item for item in addition_items(4 * args.anchors, seed=456, low=args.low, high=args.high)
           if item["question"] not in evaluated][:args.anchors]
(args.out / "anchors.jsonl").write_text("".join(json.dumps(item) + "\n" for item in anchors))
