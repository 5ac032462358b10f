"""Datasets for the local lm-eval tasks, read from the project's data root (never a fixed path).

`iclrkit eval tasks --data-root DIR` (or $ICLRKIT_DATA) passes `data_root` to these functions as task metadata;
the files are the ones the data root's README.md describes (default root: ../shared/data) (SST-2 dev from GLUE, the CounterFact sample that
KnowledgeEditor-style evaluations use). Nothing here touches the network.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path


def _root(data_root: str | None) -> Path:
    root = data_root or os.environ.get("ICLRKIT_DATA")
    if not root:
        raise FileNotFoundError("no data root: pass --data-root DIR (the folder holding sst2/, counterfact/) "
                                "or set ICLRKIT_DATA")
    return Path(root).expanduser()


def _file(data_root: str | None, relative: str) -> Path:
    path = _root(data_root) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found under the data root")
    return path


def sst2(data_root: str | None = None, **_) -> "datasets.DatasetDict":  # noqa: F821 - lazy import
    """SST-2 dev (872 sentences, label 1 = positive) as the task's validation split."""
    import datasets

    with _file(data_root, "sst2/dev.tsv").open(newline="") as handle:
        rows = [{"sentence": row["text"].strip(), "label": int(row["label"])}
                for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def counterfact(data_root: str | None = None, **_) -> "datasets.DatasetDict":  # noqa: F821 - lazy import
    """CounterFact (150 facts): does the model prefer the true object over the counterfactual one?"""
    import datasets

    records = json.loads(_file(data_root, "counterfact/kd-evaluate/counterfact_sample.json").read_text())
    rows = [{"prompt": r["prompt"], "choices": [" " + r["ground_truth"], " " + r["target_new"]], "label": 0}
            for r in records]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
