"""Unlearning data: documents (forget / retain / holdout), continuation prompts and QA pairs, read with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError
from toolkit.data.text import jsonl_values, read_file_text
from toolkit.models.tokens import pad_id  # noqa: F401 - re-exported for the unlearning modules


def _records(path: str | Path) -> list:
    """A .json list, or .jsonl objects/strings one per line; a .txt file is one record per blank-line block."""
    path = Path(path)
    text = read_file_text(path)
    if path.suffix == ".txt":
        records = [block.strip() for block in text.split("\n\n") if block.strip()]
    elif path.suffix == ".jsonl":
        records = [value for _, value in jsonl_values(path)]
    elif path.suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{path}: malformed JSON at line {exc.lineno} ({exc.msg})") from None
        if not isinstance(records, list):
            raise BadInputError(f"{path}: expected a JSON list of records")
    else:
        raise BadInputError(f"{path}: unsupported data format '{path.suffix}'", "use .txt, .json or .jsonl")
    if not records:
        raise BadInputError(f"{path} has no records")
    return records


def qa_text(question: str, answer: str) -> str:
    """The one QA layout used for training text, few-shot examples and KnowMem prompts."""
    return f"Question: {question}\nAnswer: {answer}"


def _as_document(record, path, index: int) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        if "text" in record:
            return str(record["text"])
        if "prompt" in record and "gt" in record:
            return str(record["prompt"]) + str(record["gt"])
        if "question" in record and "answer" in record:
            return qa_text(record["question"], record["answer"])
    raise BadInputError(f"{path}: record {index} is not a string, {{text}}, {{prompt, gt}} or {{question, answer}}")


def load_documents(path: str | Path, max_documents: int | None = None) -> list[str]:
    """Non-empty documents of a forget / retain / holdout file."""
    docs = [d for i, r in enumerate(_records(path)) if (d := _as_document(r, path, i)).strip()]
    if not docs:
        raise BadInputError(f"{path} has only empty documents")
    return docs[:max_documents] if max_documents else docs


def load_pairs(path: str | Path, keys: tuple[str, str], max_items: int | None = None) -> list[tuple[str, str]]:
    """(prompt, gt) or (question, answer) pairs; every record must carry both keys as non-empty strings."""
    pairs = []
    for index, record in enumerate(_records(path)):
        if not isinstance(record, dict) or any(not isinstance(record.get(k), str) for k in keys):
            raise BadInputError(f"{path}: record {index} needs string fields {keys[0]!r} and {keys[1]!r}")
        if not record[keys[0]].strip() or not record[keys[1]].strip():
            raise BadInputError(f"{path}: record {index} has an empty {keys[0]!r} or {keys[1]!r}")
        pairs.append((record[keys[0]], record[keys[1]]))
    return pairs[:max_items] if max_items else pairs


def encode_documents(tokenizer, docs: list[str], max_length: int, min_tokens: int = 4) -> list[torch.Tensor]:
    """Each document cut into consecutive windows of at most max_length tokens (short tails dropped)."""
    if max_length < min_tokens:
        raise BadInputError(f"max_length must be at least {min_tokens}, got {max_length}")
    chunks = []
    for doc in docs:
        ids = torch.tensor(tokenizer(doc, add_special_tokens=False)["input_ids"], dtype=torch.long)
        chunks.extend(c for c in ids.split(max_length) if c.numel() >= min_tokens)
    if not chunks:
        raise BadInputError(f"no document has {min_tokens} or more tokens")
    return chunks


def collate(chunks: list[torch.Tensor], pad: int) -> dict[str, torch.Tensor]:
    """Right-padded ids and attention mask."""
    width = max(c.numel() for c in chunks)
    ids = torch.full((len(chunks), width), pad, dtype=torch.long)
    mask = torch.zeros((len(chunks), width), dtype=torch.long)
    for row, chunk in enumerate(chunks):
        ids[row, :chunk.numel()] = chunk
        mask[row, :chunk.numel()] = 1
    return {"input_ids": ids, "attention_mask": mask}


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The indices of batch `step` in a seeded per-epoch shuffle: the same for a run and its resumption."""
    per_epoch = max(1, -(-n // batch_size))
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()
    picked = order[position * batch_size:(position + 1) * batch_size]
    return picked or order[:batch_size]
