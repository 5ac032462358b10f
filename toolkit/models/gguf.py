"""A GGUF file as `--model`: converted once to a plain checkpoint (safetensors + config + tokenizer) in iclrkit's
cache, which every loader then reads like any other model directory (the zoo's smollm2-135m is built the same way).

The weights are dequantized to float32 by transformers' GGUF reader, so the checkpoint carries the GGUF's
quantization error and is about 4 bytes per parameter on disk; architectures transformers cannot read from GGUF are
one line, exit 2."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError

log = logging.getLogger("iclrkit")

CONVERT_HINT = ("convert it with transformers: AutoModelForCausalLM.from_pretrained(DIR, gguf_file=NAME) and "
                "save_pretrained(OUT) (plus the tokenizer), then pass OUT")


def gguf_file(path: Path) -> Path | None:
    """The GGUF file `path` names: itself, or the only *.gguf in a directory without config.json; None otherwise."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise BadInputError(f"model directory {path} holds {len(found)} .gguf files and no config.json",
                                f"pass one of them as --model, e.g. {found[0]}")
        return found[0] if found else None
    return None


def converted_dir(gguf: Path) -> Path:
    """Where the plain checkpoint of `gguf` lives: keyed by the file's real path, size and modification time."""
    from toolkit.core.paths import cache_dir

    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{gguf.stem}-{key}"


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a+") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: the atomic rename still keeps the cache consistent
            yield
            return
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def checkpoint_for(gguf: Path) -> Path:
    """The converted checkpoint of `gguf`, converting it on first use (one process at a time, atomically)."""
    target = converted_dir(gguf)
    if (target / "config.json").is_file():
        log.info("%s: using its converted checkpoint %s", gguf, target)
        return target
    with _lock(target):
        if (target / "config.json").is_file():
            return target
        check_gguf(gguf)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log.warning("converting %s to a plain checkpoint in %s (once; float32, ~4 bytes per parameter)", gguf, target)
        try:
            convert(gguf, partial, source=str(gguf), technique="gguf",
                    notes=f"Dequantized from `{gguf.name}` by iclrkit: its weights carry that file's quantization "
                          "error.", metadata={"gguf": str(gguf)})
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        from toolkit.core.outdir import normalize_modes

        normalize_modes(partial)
        os.replace(partial, target)
    return target


def check_gguf(gguf: Path) -> None:
    """A readable GGUF header (magic, version, metadata, tensor table), or one line naming the file (exit 2)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ResourceError(f"reading the GGUF model {gguf} needs the `gguf` package", "pip install gguf") from None
    try:
        GGUFReader(str(gguf))
    except Exception as exc:  # noqa: BLE001 - the reader raises ValueError, struct.error, IndexError, ...
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise BadInputError(f"{gguf} is not a readable GGUF file: {first.replace(str(gguf), 'it')}",
                            "re-download or re-export it") from None


def convert(gguf: Path, out: Path, *, source: str, technique: str, notes: str, metadata: dict) -> Path:
    """Read `gguf` with transformers' GGUF loader and save it as a plain safetensors checkpoint at `out` (callers
    quiet transformers' bars first: toolkit.models.source.quiet_transformers)."""
    try:
        import gguf as _gguf  # noqa: F401 - transformers' GGUF reader needs it
    except ImportError:
        raise ResourceError(f"reading the GGUF model {gguf} needs the `gguf` package", "pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.models.save import plain_config, save_model

    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (ValueError, KeyError, OSError, TypeError, IndexError, AttributeError, NotImplementedError) as exc:
        text = str(exc).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise BadInputError(f"cannot read the GGUF model {gguf}: {first}", CONVERT_HINT) from None
    model = AutoModelForCausalLM.from_config(plain_config(loaded.config), dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    save_model(model, tokenizer, out, technique=technique, source=source, notes=notes, metadata=metadata)
    return out
