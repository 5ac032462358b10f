"""run.json + config.resolved.yaml for every command (DESIGN §4)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMA_VERSION = 1


def git_sha() -> str | None:
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
    """{"path", "sha256"} of an input; zoo:NAME is hashed from its cache directory (and names it as `resolved`)."""
    text = str(value)
    if text.startswith("zoo:"):
        from toolkit.core.paths import zoo_cached_path

        resolved = zoo_cached_path(text[4:])
        return {"path": text, "resolved": str(resolved), "sha256": sha256_of(resolved)}
    if isinstance(value, (str, Path)) and Path(value).exists():
        return {"path": text, "sha256": sha256_of(value)}
    return {"path": text, "sha256": None}


def sha256_of(path: str | Path, limit_bytes: int = 1 << 30) -> str | None:
    """Digest of a file, or of a directory's file names and contents (sorted); None for non-paths."""
    path = Path(path)
    if not path.exists():
        return None
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    read = 0
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                read += len(chunk)
                if read > limit_bytes:
                    return digest.hexdigest() + "-partial"
    return digest.hexdigest()


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
