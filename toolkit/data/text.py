"""Text sources (`.txt`, `.jsonl[:field]`, `embedded`, hub dataset id), calibration windows and splits."""

from __future__ import annotations

import json
import random
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError

EMBEDDED = "embedded"


def embedded_text() -> str:
    """Python's own documentation text: present in every CPython, so demos and tests need no download."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def read_file_text(path: str | Path) -> str:
    """A data file's text; a missing or unreadable file is a one-line input error."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"data file not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read {path}: {exc}") from None


def jsonl_values(path: str | Path) -> list[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line of a JSONL file; a malformed line names itself."""
    values = []
    for number, line in enumerate(read_file_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{path}:{number}: malformed JSON ({exc.msg})") from None
    return values


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict]:
    """Records of a JSONL file; a malformed line or a missing required field names the line."""
    records = []
    for number, record in jsonl_values(path):
        if not isinstance(record, dict):
            raise BadInputError(f"{path}:{number}: each line must be a JSON object")
        missing = [key for key in required if key not in record]
        if missing:
            raise BadInputError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
        records.append(record)
    if not records:
        raise BadInputError(f"{path} has no records")
    return records


def load_text(source: str | None, field: str = "text") -> str:
    """The whole text of a source. `file.jsonl:field` picks a field; None or 'embedded' is the embedded text."""
    if source in (None, "", EMBEDDED):
        return embedded_text()
    path_part, _, field_part = str(source).partition(":") if ".jsonl:" in str(source) else (str(source), "", "")
    path = Path(path_part).expanduser()
    if path.exists():
        text = _read_file(path, field_part or field)
    elif "/" in str(source) and not str(source).startswith((".", "/", "~")) and not path.suffix:
        text = _hub_dataset_text(str(source), field)
    else:
        raise BadInputError(f"data file not found: {source}")
    if not text.strip():
        raise BadInputError(f"data source {source} is empty")
    return text


def _read_file(path: Path, field: str) -> str:
    if path.is_dir():
        raise BadInputError(f"data path {path} is a directory; give a .txt or .jsonl file")
    if path.suffix == ".jsonl":
        records = read_jsonl(path)
        missing = [i for i, r in enumerate(records, 1) if field not in r]
        if missing:
            raise BadInputError(f"{path}: record {missing[0]} has no field '{field}'", "use FILE.jsonl:FIELD")
        return "\n\n".join(str(r[field]) for r in records)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read {path}: {exc}") from None


def _hub_dataset_text(dataset_id: str, field: str) -> str:
    from toolkit.models.source import offline

    if offline():
        raise ResourceError(f"offline: cannot load hub dataset '{dataset_id}'", "pass a local .txt/.jsonl file")
    try:
        import datasets
    except ImportError:
        raise ResourceError("hub datasets need the 'datasets' package", "pip install datasets") from None
    name, _, config = dataset_id.partition("@")
    split = datasets.load_dataset(name, config or None, split="train")
    return "\n\n".join(str(x) for x in split[field])


def split_text(text: str, test_fraction: float = 0.1, seed: int = 0) -> tuple[str, str]:
    """Train/test split by paragraph blocks (blank-line separated), deterministic in the seed."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    if len(blocks) < 2:
        cut = int(len(text) * (1 - test_fraction))
        return text[:cut], text[cut:]
    order = list(range(len(blocks)))
    random.Random(seed).shuffle(order)
    n_test = max(1, int(round(len(blocks) * test_fraction)))
    test_ids = set(order[:n_test])
    train = "\n\n".join(b for i, b in enumerate(blocks) if i not in test_ids)
    test = "\n\n".join(b for i, b in enumerate(blocks) if i in test_ids)
    return train, test


def tokenize(tokenizer, text: str):
    """1-D LongTensor of token ids of the whole text (chunked, so long texts do not trip length warnings)."""
    import torch

    ids: list[int] = []
    chunk = 200_000
    for start in range(0, len(text), chunk):
        ids.extend(tokenizer(text[start:start + chunk], add_special_tokens=False)["input_ids"])
    if not ids:
        raise BadInputError("the data tokenizes to nothing")
    return torch.tensor(ids, dtype=torch.long)


def calibration_windows(tokenizer, text: str, n: int, seqlen: int, seed: int = 0):
    """n random windows of seqlen tokens, shape (n, seqlen); deterministic in the seed. Where the tokenizer adds a
    BOS token (`toolkit.models.tokens.bos_id`), each window is BOS + seqlen - 1 tokens of text: the statistics are
    gathered on inputs as the model sees them."""
    import torch

    from toolkit.models.tokens import bos_id

    bos = bos_id(tokenizer)
    ids = tokenize(tokenizer, text)
    if bos is not None and seqlen > 1:
        windows = calibration_windows_of(ids, n, seqlen - 1, seed)
        return torch.cat([torch.full((windows.shape[0], 1), bos, dtype=windows.dtype), windows], dim=1)
    return calibration_windows_of(ids, n, seqlen, seed)


def calibration_windows_of(ids, n: int, seqlen: int, seed: int = 0):
    """n random windows of seqlen of the token ids, shape (n, seqlen); deterministic in the seed."""
    import torch

    if ids.numel() <= seqlen:
        raise BadInputError(f"calibration text has {ids.numel()} tokens, shorter than one window of {seqlen}",
                            "give more text or lower --seqlen")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seqlen, (n,), generator=generator)
    return torch.stack([ids[s:s + seqlen] for s in starts.tolist()])
