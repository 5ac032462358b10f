"""run.json + config.resolved.yaml for every command (DESIGN §4)."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMA_VERSION = 1


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the code this process runs: read once (the runner asks when a run starts), so a run that lasts
    while new commits land records the commit it started from, not the HEAD at its end."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "transformers"):
        module = sys.modules.get(name)
        env[name] = getattr(module, "__version__", None) if module else None
    torch = sys.modules.get("torch")
    env["cuda"] = torch.version.cuda if torch is not None and torch.cuda.is_available() else None
    env["threads"] = torch.get_num_threads() if torch is not None else None
    return env


def input_record(value: Any) -> dict[str, Any]:
    """{"path", "sha256", "sha256_of"} of an input; zoo:NAME is hashed from its cache directory (named as `resolved`).

    A file's sha256 is that of its bytes (what `sha256sum FILE` prints: the same bytes under two names hash the
    same); a directory's is the sha256 of its manifest, `sha256sum` lines of its files sorted by path, which
    `cd DIR && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum` reproduces."""
    text = str(value)
    if text.startswith("zoo:"):
        from toolkit.core.paths import zoo_cached_path

        resolved = zoo_cached_path(text[4:])
        return {"path": text, "resolved": str(resolved), **_digest_fields(resolved)}
    if isinstance(value, (str, Path)) and Path(value).exists():
        return {"path": text, **_digest_fields(Path(value))}
    return {"path": text, "sha256": None}


def _digest_fields(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"sha256": None}
    return {"sha256": sha256_of(path), "sha256_of": "manifest" if path.is_dir() else "bytes"}


def _file_digest(file: Path, budget: list[int]) -> tuple[str, bool]:
    """(sha256 of the file's bytes, complete?) reading at most budget[0] bytes, which it decrements."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while budget[0] > 0 and (chunk := handle.read(min(1 << 20, budget[0]))):
            digest.update(chunk)
            budget[0] -= len(chunk)
        complete = not handle.read(1)
    return digest.hexdigest(), complete


def sha256_of(path: str | Path, limit_bytes: int = 1 << 30) -> str | None:
    """sha256 of a file's bytes, or of a directory's manifest (`HASH  ./relative/path` lines, sorted as byte
    strings, as `sha256sum` writes them); None for non-paths. Past `limit_bytes` read, the digest covers what was
    read and ends in `-partial`."""
    path = Path(path)
    if not path.exists():
        return None
    budget = [limit_bytes]
    if not path.is_dir():
        digest, complete = _file_digest(path, budget)
        return digest if complete else digest + "-partial"
    names = sorted("./" + p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    manifest = hashlib.sha256()
    for name in names:
        digest, complete = _file_digest(path / name, budget)
        if not complete:
            return manifest.hexdigest() + "-partial"
        manifest.update(f"{digest}  {name}\n".encode())
    return manifest.hexdigest()


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return value


def _run_warnings() -> list[str]:
    from toolkit.core.context import RUN_WARNINGS

    return list(RUN_WARNINGS)


def build_run_record(*, command: str, technique: str, config: dict, ctx, started: dt.datetime,
                     duration_s: float, status: str) -> dict[str, Any]:
    inputs = {k: input_record(v) for k, v in ctx.inputs.items()}
    from toolkit import __version__

    return jsonable({
        "schema_version": SCHEMA_VERSION, "iclrkit_version": __version__, "git_sha": git_sha(),
        "command": command, "technique": technique, "config": config, "seed": ctx.seed,
        "device": ctx.device, "dtype": ctx.dtype or "float32", "env": environment(), "inputs": inputs,
        "metrics": ctx.metrics, "baselines": ctx.baselines, "artifacts": sorted(set(ctx.artifacts)),
        "caches": dict(getattr(ctx, "caches", {}) or {}), "warnings": _run_warnings(),
        "started_at": started.isoformat(timespec="seconds"), "duration_s": round(duration_s, 3), "status": status,
        **({"verdict": ctx.verdict} if getattr(ctx, "verdict", None) else {}),
    })


def write_run_files(out: Path, record: dict[str, Any]) -> None:
    (out / "run.json").write_text(json.dumps(record, indent=2) + "\n")
    (out / "config.resolved.yaml").write_text(yaml.safe_dump(record["config"], sort_keys=False))
