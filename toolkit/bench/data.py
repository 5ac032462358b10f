"""Annotation files for the benchmarks: JSON (a list, or {"data": [...]}) , JSONL, or Parquet (needs pyarrow)."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError


def load_records(path: Path) -> list[dict]:
    if not path.is_file():
        raise BadInputError(f"annotation file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ResourceError("reading Parquet needs pyarrow", "pip install pyarrow, or convert to JSONL") from None
        rows = pq.read_table(path).to_pylist()
    elif suffix == ".jsonl":
        from toolkit.data.text import read_jsonl

        rows = read_jsonl(str(path))
    elif suffix == ".json":
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise BadInputError(f"malformed JSON in {path} at line {exc.lineno}") from None
        rows = loaded.get("data") if isinstance(loaded, dict) else loaded
    else:
        raise BadInputError(f"unsupported annotation format {path.name}", "use .json, .jsonl or .parquet")
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise BadInputError(f"{path}: expected a list of records")
    if not rows:
        raise BadInputError(f"{path}: no records")
    return rows


def require_fields(rows: list[dict], fields: tuple[str, ...], source: Path) -> None:
    for number, row in enumerate(rows, 1):
        missing = [name for name in fields if name not in row]
        if missing:
            raise BadInputError(f"{source}: record {number} lacks {', '.join(missing)}")


def find_annotation(data: Path, stems: tuple[str, ...]) -> Path:
    """A file as given, or the first <dir>/<stem>.{jsonl,json,parquet} that exists."""
    if data.is_file():
        return data
    if not data.is_dir():
        raise BadInputError(f"data not found: {data}")
    for stem in stems:
        for suffix in (".jsonl", ".json", ".parquet"):
            if (data / f"{stem}{suffix}").is_file():
                return data / f"{stem}{suffix}"
    raise BadInputError(f"no annotation file in {data}", f"expected one of {', '.join(s + '.jsonl' for s in stems)}")
