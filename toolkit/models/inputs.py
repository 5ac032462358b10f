"""The input knobs of a config (models and data) and what can be checked about them before a run: a path that does
not exist, an unknown zoo model, a model directory whose config.json or safetensors headers are broken, a GGUF
without a readable header, a text file that is not UTF-8. Each is one line, exit 2, before anything loads.

An input knob is a field named model/models/data, one declared with `model_field()`/`data_field()` (short -m/-d), or
one whose json_schema_extra names `input: "model" | "data"`."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, Iterator

from toolkit.core.errors import BadInputError

FILE_SUFFIXES = {".txt", ".jsonl", ".json", ".csv", ".tsv", ".npy", ".npz", ".safetensors", ".bin", ".gguf", ".pt",
                 ".pth", ".onnx", ".yaml", ".yml", ".parquet", ".png", ".jpg", ".zip"}
TEXT_SUFFIXES = {".txt", ".jsonl", ".json", ".csv", ".tsv", ".yaml", ".yml"}
HEAD_BYTES = 1 << 20


def input_kind(name: str, field: Any) -> str | None:
    """"model", "data" or None for config field `name`."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if extra.get("input") in ("model", "data"):
        return extra["input"]
    if name in ("model", "models") or extra.get("short") == "-m":
        return "model"
    if name == "data" or extra.get("short") == "-d":
        return "data"
    return None


def input_fields(cls: type) -> dict[str, str]:
    """{field name: "model" | "data"} of a config class."""
    return {name: kind for name, field in getattr(cls, "model_fields", {}).items()
            if (kind := input_kind(name, field)) is not None}


def _values(value: Any) -> Iterator[str]:
    """The texts of a value; `a,b` (merge's --model list) is two unless it names an existing path itself."""
    if isinstance(value, (str, Path)):
        text = str(value)
        if "," in text and _existing(text) is None:
            yield from (part.strip() for part in text.split(",") if part.strip())
        elif text:
            yield text
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _values(item)


def looks_like_path(text: str) -> bool:
    """A value meant as a file or directory (not a hub id, a keyword such as `embedded`, or a server spec)."""
    return (text.startswith((".", "/", "~")) or text.count("/") >= 2 or text.endswith("/")
            or Path(text).suffix.lower() in FILE_SUFFIXES)


def _existing(text: str) -> Path | None:
    """The path a value names: itself, FILE of FILE:field, PATH of kind:PATH."""
    for candidate in (text, text.rsplit(":", 1)[0] if ":" in text else None,
                      text.split(":", 1)[1] if ":" in text else None):
        if candidate and Path(candidate).expanduser().exists():
            return Path(candidate).expanduser()
    return None


def check_inputs(config: Any, flag_of=lambda name: "--" + name.replace("_", "-")) -> None:
    """Every model and data input of `config` that names a path exists and is readable as far as its headers go."""
    for name, kind in input_fields(type(config)).items():
        for text in _values(getattr(config, name, None)):
            check_input(text, kind, flag_of(name))


def check_input(text: str, kind: str, flag: str) -> None:
    if text.startswith("zoo:"):
        from toolkit.zoo.registry import RECIPES

        base = text[4:].partition("@")[0]
        if base not in RECIPES:
            raise BadInputError(f"{flag} {text}: unknown zoo model '{base}'", f"known: {', '.join(RECIPES)}")
        return
    path = _existing(text)
    if path is None:
        bare = text.rsplit(":", 1)[0] if ":" in text and not text.startswith(("openai:", "http")) else text
        if looks_like_path(bare) and not text.startswith(("openai:", "http:", "https:")):
            what = "model path" if kind == "model" else "data file" if Path(bare).suffix else "data path"
            raise BadInputError(f"{what} not found: {text}" + (f" ({flag})" if flag not in ("--model", "--data")
                                                               else ""))
        return
    if kind == "model":
        _check_model(path, flag)
    elif path.is_file() and path.suffix.lower() in TEXT_SUFFIXES:
        _check_text(path, flag)


def _check_model(path: Path, flag: str) -> None:
    import json

    from toolkit.models.source import safetensors_problem

    if path.is_file():
        if path.suffix.lower() == ".gguf":
            from toolkit.models.gguf import check_gguf

            check_gguf(path)
        elif path.suffix.lower() == ".safetensors" and (problem := safetensors_problem(path)):
            raise BadInputError(f"{flag} {path}: corrupt safetensors file: {problem}", "re-download or re-save it")
        return
    config = path / "config.json"
    if config.is_file():
        try:
            parsed = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BadInputError(f"{flag} {path}: unreadable config.json ({type(exc).__name__})",
                                "re-download or re-save the model") from None
        if not isinstance(parsed, dict):
            raise BadInputError(f"{flag} {path}: config.json is not a JSON object")
    for file in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise BadInputError(f"corrupt safetensors file {file}: {problem}", "re-download or re-save the model")


def _check_text(path: Path, flag: str) -> None:
    """The first MiB decodes as UTF-8 (a binary file given as text is named before anything loads)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    try:
        decoder.decode(head, final=len(head) < HEAD_BYTES)
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{flag} {path} is not UTF-8 text: {exc.reason} at byte {exc.start}",
                            "pass a text file (.txt/.jsonl/.csv) or the binary format the command accepts") from None


def _named_paths(text: str) -> list[str]:
    """The existing paths a value names (see _existing), or zoo:NAME."""
    if text.startswith("zoo:"):
        return [text]
    path = _existing(text) if text else None
    return [str(path)] if path is not None else []


def guarded_inputs(config: Any) -> list[str]:
    """Every path the resolved config names, however it was given (flag, --set, --config): model and data always,
    and any other value the user set that names an existing file or directory (a second data set, a reference
    model, an index...). --out may not go into any of them (check_out_dir)."""
    found: list[str] = []

    def visit(value: Any) -> None:
        if isinstance(value, (str, Path)):
            found.extend(_named_paths(str(value)))
        elif isinstance(value, (list, tuple, set)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif hasattr(type(value), "model_fields"):
            for name in type(value).model_fields:
                visit(getattr(value, name))

    for name, declared in type(config).model_fields.items():
        value = getattr(config, name)
        if name in ("model", "data") or value != declared.default:
            visit(value)
    return found
