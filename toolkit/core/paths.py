"""The cache locations of the house, decided once (core knows them so it can protect them from --out)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """iclrkit's own cache (edit covariance statistics, converted GGUF models, ...): ICLRKIT_CACHE_DIR, default
    ~/.cache/iclrkit."""
    return Path(os.environ.get("ICLRKIT_CACHE_DIR", Path.home() / ".cache" / "iclrkit")).expanduser()


def zoo_dir() -> Path:
    """The zoo's cache: ICLRKIT_ZOO_DIR, default ~/.cache/iclrkit/zoo."""
    return Path(os.environ.get("ICLRKIT_ZOO_DIR", Path.home() / ".cache" / "iclrkit" / "zoo")).expanduser()


def zoo_cached_path(name: str) -> Path:
    """Where zoo model NAME (a recipe, or NAME@variant) lives in the cache, built or not."""
    return zoo_dir() / name


def hf_cache_dir() -> Path | None:
    """The Hugging Face hub cache (HF_HUB_CACHE / HF_HOME), or None without huggingface_hub."""
    try:
        from huggingface_hub import constants
    except Exception:  # noqa: BLE001 - no huggingface_hub: no hub cache to name
        return None
    return Path(constants.HF_HUB_CACHE).expanduser()


def caches() -> dict[str, Path]:
    """Every cache --out must never point into (or contain): {name: directory}."""
    named = {"zoo cache": zoo_dir(), "iclrkit cache": cache_dir()}
    hub = hf_cache_dir()
    if hub is not None:
        named["Hugging Face cache"] = hub
    return named
