"""Resolve `--model`: a local path, a hub id, or zoo:NAME — offline-first, one clear line when missing."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError

log = logging.getLogger("iclrkit")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false") or os.environ.get("ICLRKIT_OFFLINE") == "1"


def looks_like_path(spec: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else that does not exist is a missing path."""
    return (spec.startswith((".", "/", "~")) or spec.count("/") >= 2 or spec.endswith("/")
            or Path(spec).suffix in (".safetensors", ".bin", ".gguf", ".pt", ".json"))


def resolve_model_path(spec: str) -> Path | str:
    """Local directory for a path or zoo:NAME (built on first use), or the hub id itself."""
    if not spec:
        raise BadInputError("--model is empty")
    if spec.startswith("zoo:"):
        from toolkit.zoo.registry import ensure_built

        return ensure_built(spec[4:])
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not any(path.glob("*.gguf")):
            raise BadInputError(f"model directory {path} has no config.json")
        return path
    if looks_like_path(spec):
        raise BadInputError(f"model path not found: {spec}")
    if offline() and not _hub_cached(spec):
        raise ResourceError(f"'{spec}' is not a local path, and offline the hub model '{spec}' is not cached",
                            "pass a local path or zoo:NAME, or unset HF_HUB_OFFLINE")
    return spec


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - an unreadable cache means not cached
        return False


def _quiet_transformers() -> None:
    """stderr carries our progress and one-line errors; transformers' own bars and notices only with -vv."""
    if os.environ.get("TRANSFORMERS_VERBOSITY") in ("info", "debug"):
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    source = resolve_model_path(spec)
    try:
        return AutoTokenizer.from_pretrained(str(source), local_files_only=offline())
    except OSError as exc:
        raise ResourceError(f"could not load a tokenizer for '{spec}': {str(exc).splitlines()[0]}") from None


def load_model(spec: str, device: str = "cpu", dtype=None, kind: str = "causal-lm", with_tokenizer: bool = True):
    """(model, tokenizer) in eval mode. kind: causal-lm | masked-lm | seq-cls | base."""
    import torch
    import transformers

    classes = {"causal-lm": transformers.AutoModelForCausalLM, "masked-lm": transformers.AutoModelForMaskedLM,
               "seq-cls": transformers.AutoModelForSequenceClassification, "base": transformers.AutoModel}
    if kind not in classes:
        raise BadInputError(f"unknown model kind '{kind}'")
    source = resolve_model_path(spec)
    if isinstance(source, Path) and (source / "model.packed.safetensors").is_file():  # a compress run's packed/
        from toolkit.export.quantized import load_packed_model

        return load_packed_model(source, device, dtype, kind, with_tokenizer)
    _quiet_transformers()
    try:
        model = classes[kind].from_pretrained(str(source), dtype=dtype or torch.float32, local_files_only=offline())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"could not load '{spec}' as a {kind} model: {str(exc).splitlines()[0]}") from None
    model.to(device).eval()
    tokenizer = load_tokenizer(spec) if with_tokenizer else None
    return model, tokenizer
