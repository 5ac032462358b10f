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
        from toolkit.models.gguf import checkpoint_for, gguf_file

        gguf = gguf_file(path)
        if gguf is not None:  # converted once into iclrkit's cache, then read like any checkpoint directory
            _quiet_transformers()
            return checkpoint_for(gguf)
        if path.is_dir() and not (path / "config.json").exists():
            raise BadInputError(f"model directory {path} has no config.json")
        return path
    if looks_like_path(spec):
        raise BadInputError(f"model path not found: {spec}")
    if offline() and not _hub_cached(spec):
        raise ResourceError(f"'{spec}' is not a local path, and offline the hub model '{spec}' is not cached",
                            "pass a local path or zoo:NAME, or unset HF_HUB_OFFLINE")
    if not offline() and not _hub_cached(spec):
        _check_hub_reachable(spec)
    return spec


def _check_hub_reachable(spec: str, timeout_s: float = 5.0) -> None:
    """One quick connect to the hub endpoint instead of huggingface_hub's ~25 s of logged retries (exit 3)."""
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                                             "ALL_PROXY", "all_proxy")):
        return  # through a proxy a direct connect proves nothing; the load's own error is mapped instead
    try:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    except Exception:  # noqa: BLE001
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ResourceError(f"the hub {endpoint} is unreachable ({exc.strerror or type(exc).__name__}) and "
                            f"'{spec}' is not cached", "check the network, or pass a local path or zoo:NAME") from None


def safetensors_problem(file: Path) -> str | None:
    """Why a .safetensors file cannot be read (unreadable header, or not the size its header declares), else None.
    Reads the header only: cheap enough to check every shard (or checkpoint) before anything is loaded."""
    import json
    import struct

    size = file.stat().st_size
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(handle.read(length))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, AttributeError) as exc:
        return f"unreadable header ({exc})"
    if 8 + length + end != size:
        return f"{size} bytes, the header needs {8 + length + end} (truncated?)"
    return None


def check_safetensors(directory: Path) -> None:
    """Every *.safetensors file under a model directory has a readable header and the size it declares (exit 2)."""
    for file in sorted(Path(directory).glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise BadInputError(f"corrupt safetensors file {file}: {problem}", "re-download or re-save the model")


ENCODER_TYPES = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta",
                 "camembert", "mpnet", "modernbert", "ernie", "convbert", "squeezebert", "longformer", "rembert",
                 "xlm-roberta-xl", "megatron-bert", "nezha", "funnel", "layoutlm", "canine", "esm"}


def check_causal_lm(source: Path | str, spec: str) -> None:
    """Causal-LM commands refuse encoder (bidirectional) models up front, naming the architecture (exit 2)."""
    import json

    config_file = Path(str(source)) / "config.json"
    if not config_file.is_file():
        return  # a hub id or a GGUF: transformers' own loader decides
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        raise BadInputError(f"unreadable config.json in {source}") from None
    if not isinstance(config, dict):
        raise BadInputError(f"config.json in {source} is not a JSON object")
    architectures = config.get("architectures") or []
    model_type = str(config.get("model_type", ""))
    causal = any(("CausalLM" in a or "LMHead" in a) for a in architectures)
    if (model_type in ENCODER_TYPES and not config.get("is_decoder")) or (architectures and not causal and any(
            a.endswith(("ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                        "ForQuestionAnswering", "ForMultipleChoice")) for a in architectures)):
        name = ", ".join(architectures) or model_type
        raise BadInputError(f"'{spec}' is an encoder model ({name}); this command needs a causal (decoder) LM",
                            "pass a causal LM such as zoo:gpt2-tiny")


def _load_failure(spec: str, kind: str, exc: BaseException) -> Exception | None:
    """One line for a failed from_pretrained: blocked pickles, corrupt files and an unreachable hub by name."""
    import pickle

    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if isinstance(exc, pickle.UnpicklingError) or "Weights only load failed" in text:
        return BadInputError(f"'{spec}' holds a pickle (.bin) that is not plain tensors; it was not loaded because "
                             "it could run code", "use a safetensors copy of the model from a trusted source")
    if type(exc).__name__ == "SafetensorError":
        return BadInputError(f"corrupt safetensors file in '{spec}': {first}", "re-download or re-save the model")
    if "couldn't connect" in text or type(exc).__name__ in ("ConnectError", "ConnectionError", "ConnectTimeout",
                                                            "ReadTimeout"):
        return ResourceError(f"the hub is unreachable and '{spec}' is not cached: {first}",
                             "check the network, or pass a local path or zoo:NAME")
    if isinstance(exc, (OSError, ValueError)):
        return BadInputError(f"could not load '{spec}' as a {kind} model: {first}")
    return None


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
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)  # its retry notices: one line at the end instead


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    source = resolve_model_path(spec)
    try:
        return AutoTokenizer.from_pretrained(str(source), local_files_only=offline())
    except OSError as exc:
        if "couldn't connect" in str(exc):
            raise _load_failure(spec, "tokenizer", exc) from None
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
    if isinstance(source, Path):  # formats registered beyond transformers' (e.g. a compress run's packed/)
        from toolkit.core.registry import registry

        for fmt in registry("model-format"):
            if fmt.meta["detect"](source):
                return fmt.obj(source, device, dtype, kind, with_tokenizer)
    if kind == "causal-lm":
        check_causal_lm(source, spec)
    if isinstance(source, Path) and source.is_dir():
        check_safetensors(source)
    _quiet_transformers()
    try:
        model = classes[kind].from_pretrained(str(source), dtype=dtype or torch.float32, local_files_only=offline())
    except Exception as exc:  # noqa: BLE001 - loader failures the user can fix become one named line
        mapped = _load_failure(spec, kind, exc)
        if mapped is None:
            raise
        raise mapped from None
    model.to(device).eval()
    tokenizer = load_tokenizer(spec) if with_tokenizer else None
    return model, tokenizer
