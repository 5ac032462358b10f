"""Load and save the models a merge reads and writes.

Plain torch models (the digits zoo) are a directory with `model.safetensors` + `config.json` whose `iclrkit_plain`
key names the family and architecture, so this loader can rebuild them. Anything else is loaded as a Hugging Face
model and the merge is saved back with `toolkit.models.save.save_model` (from_pretrained loads it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from toolkit.core.errors import BadInputError, require

# families whose merges may differ in depth: the projection deepens them (toolkit/merge/deepen.py)
DEEPENABLE = ("digits-mlp", "digits-cnn", "hf-gpt2")

PLAIN_KEY = "iclrkit_plain"


@dataclass
class PlainModel:
    """A model as the merge sees it: a family name, an architecture dict and an ordered state dict."""

    family: str
    arch: dict
    state: dict[str, torch.Tensor]
    task: dict | None = None
    source: str = ""
    hf_model: Any = None
    tokenizer: Any = None
    metadata: dict = field(default_factory=dict)


def save_plain(model: PlainModel, out: Path, metadata: dict | None = None) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state.items()}, str(out / "model.safetensors"))
    config = {PLAIN_KEY: {"family": model.family, "arch": model.arch, "task": model.task,
                          "order": list(model.state)}, "iclrkit": metadata or {}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_for_merge(spec: str, device: str = "cpu") -> PlainModel:
    """A plain zoo model or a Hugging Face causal LM; rejects missing paths and non-finite weights."""
    path = Path(spec)
    config_file = path / "config.json"
    if path.exists() and config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as exc:
            raise BadInputError(f"malformed config.json in {path}: {exc.msg} at line {exc.lineno}") from None
        if PLAIN_KEY in config:
            model = _load_plain(path, config)
            _check_finite(model)
            return model
    elif not spec.startswith("zoo:") and ("/" in spec or path.suffix or spec.startswith(".")):
        require(path.exists(), f"model not found: {spec}")
    from toolkit.models.source import load_model

    hf_model, tokenizer = load_model(spec, device=device)
    model = PlainModel(family=f"hf-{hf_model.config.model_type}", arch=_hf_arch(hf_model.config),
                       state=untied_state(hf_model), source=spec, hf_model=hf_model, tokenizer=tokenizer,
                       task=_lm_task(hf_model.config, path))
    _check_finite(model)
    return model


def _load_plain(path: Path, config: dict) -> PlainModel:
    from safetensors.torch import load_file

    weights = path / "model.safetensors"
    require(weights.is_file(), f"{path} has an {PLAIN_KEY} config.json but no model.safetensors")
    spec = config[PLAIN_KEY]
    loaded = load_file(str(weights))
    order = spec.get("order") or list(loaded)
    require(set(order) == set(loaded), f"{weights}: tensor names do not match config.json's order list")
    return PlainModel(family=spec["family"], arch=spec["arch"], state={k: loaded[k] for k in order},
                      task=spec.get("task"), source=str(path), metadata=config.get("iclrkit", {}))


def _lm_task(config, path: Path) -> dict | None:
    """An LM zoo model's task: its held-out text (a path relative to the model directory) and scoring sizes."""
    task = dict((getattr(config, "iclrkit", None) or {}).get("task") or {})
    if not task.get("heldout"):
        return None
    task["heldout"] = str((path / task["heldout"]).resolve())
    require(Path(task["heldout"]).is_file(), f"{path}: the held-out text named in config.json is missing")
    return task


def untied_state(hf_model) -> dict[str, torch.Tensor]:
    """The state dict without the aliases of tied weights (GPT-2's lm_head is wte): each tensor is merged once."""
    state, seen = {}, set()
    for name, tensor in hf_model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach().clone()
    return state


def _hf_arch(config) -> dict:
    keys = ("model_type", "hidden_size", "n_embd", "num_hidden_layers", "n_layer", "n_head", "num_attention_heads",
            "intermediate_size", "vocab_size")
    return {k: getattr(config, k) for k in keys if hasattr(config, k)}


def _check_finite(model: PlainModel) -> None:
    for name, tensor in model.state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise BadInputError(f"{model.source}: weight '{name}' contains NaN or Inf")


def check_same_family(models: list[PlainModel], depths_may_differ: bool = False) -> None:
    """One family and the same parameter names; with `depths_may_differ` (merges that project into a target layout),
    the names may differ in layer count for the families the projection can deepen (toolkit/merge/deepen.py)."""
    require(len(models) > 0, "empty model list: give at least two models with --models")
    require(len(models) >= 2, "a merge needs at least two models")
    families = {m.family for m in models}
    require(len(families) == 1, f"models of incompatible families cannot be merged: {sorted(families)}")
    if depths_may_differ and models[0].family in DEEPENABLE:
        return
    names = [list(m.state) for m in models]
    require(all(n == names[0] for n in names),
            f"{models[0].source} and the other models have different parameter names: not one architecture family")


def like(template: PlainModel, state: dict[str, torch.Tensor], arch: dict | None = None) -> PlainModel:
    """A merged model shaped like `template` (family, task union, HF object reused for saving)."""
    return PlainModel(family=template.family, arch=arch or template.arch, state=state, task=None,
                      source="merged", hf_model=template.hf_model, tokenizer=template.tokenizer)


def save_merged(model: PlainModel, out: Path, technique: str, parents: list[str], paper: str, command: str,
                metadata: dict, notes: str = "") -> Path:
    meta = {"technique": technique, "parents": parents, **metadata}
    if model.hf_model is None:
        return save_plain(model, out, metadata=meta)
    from toolkit.models.save import save_model

    missing, unexpected = model.hf_model.load_state_dict(model.state, strict=False)
    tied = set(model.hf_model.state_dict()) - set(untied_state(model.hf_model))
    require(not unexpected and set(missing) <= tied, f"merged state does not fit the model: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}")
    return save_model(model.hf_model, model.tokenizer, out, technique=technique, source=" + ".join(parents),
                      paper=paper, command=command, notes=notes, metadata=meta)


def parse_model_list(models: list[str] | str | None) -> list[str]:
    """Comma-separated and/or repeated specs; a directory that is not itself a model expands to its model dirs."""
    raw = [models] if isinstance(models, str) else list(models or [])
    specs: list[str] = []
    for item in raw:
        for spec in (s.strip() for s in item.split(",")):
            if not spec:
                continue
            path = Path(spec)
            if path.is_dir() and not (path / "config.json").exists():
                inner = sorted(str(p) for p in path.iterdir() if (p / "config.json").is_file())
                require(inner, f"{spec} holds no model directories")
                specs.extend(inner)
            else:
                specs.append(spec)
    require(specs, "empty model list: give the models to merge with --models A,B")
    return specs
