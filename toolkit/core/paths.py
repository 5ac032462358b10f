"""The cache locations of the house, decided once (core knows them so it can protect them from --out)."""

from __future__ import annotations

import os
from pathlib import Path


def zoo_dir() -> Path:
    """The zoo's cache: ICLRKIT_ZOO_DIR, default ~/.cache/iclrkit/zoo."""
    return Path(os.environ.get("ICLRKIT_ZOO_DIR", Path.home() / ".cache" / "iclrkit" / "zoo")).expanduser()


def zoo_cached_path(name: str) -> Path:
    """Where zoo model NAME (a recipe, or NAME@variant) lives in the cache, built or not."""
    return zoo_dir() / name
