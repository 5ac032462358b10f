"""Save a produced model so `from_pretrained` loads it: safetensors shards, config, tokenizer, generation config, card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit.core.records import command_line

CARD = """---
library_name: transformers
tags: [iclrkit, {technique}]
---
# {title}

Produced by [iclrkit](https://github.com/) `{technique}` from `{source}`.

- Paper: {paper}
- Command: `{command}`

{notes}
"""


def plain_config(config):
    """A copy of `config` without a GGUF `quantization_config`: the weights of a GGUF-loaded model are dequantized
    floats, so the checkpoint written from them is a plain one (transformers refuses to save the GGUF state)."""
    clean = config.__class__.from_dict({k: v for k, v in config.to_dict().items() if k != "quantization_config"})
    return clean


def is_gguf_quantized(model) -> bool:
    quant = getattr(model.config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(getattr(method, "value", method)) == "gguf"


def drop_gguf_state(model) -> None:
    """Forget the GGUF loading state in place (dequantized weights stay): the model then saves as a plain checkpoint.
    Models from zoo caches written before the zoo stored plain configs, or loaded by a user from a .gguf file,
    carry it."""
    if not is_gguf_quantized(model):
        return
    for module in model.modules():
        for attr in ("hf_quantizer", "quantization_method", "is_quantized"):
            if attr in vars(module):
                delattr(module, attr)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")


def save_model(model, tokenizer, out: Path, *, technique: str, source: str, paper: str = "", command: str = "",
               notes: str = "", metadata: dict[str, Any] | None = None, max_shard_size: str = "2GB") -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drop_gguf_state(model)
    if metadata:
        setattr(model.config, "iclrkit", metadata)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    generation = getattr(model, "generation_config", None)
    if generation is not None and not (out / "generation_config.json").exists():
        generation.save_pretrained(out)
    (out / "README.md").write_text(CARD.format(title=f"{technique}: {Path(str(source)).name}", technique=technique,
                                               source=source, paper=paper or "-", command=command or command_line(),
                                               notes=notes))
    return out


def read_metadata(path: Path) -> dict[str, Any]:
    config = json.loads((Path(path) / "config.json").read_text())
    return config.get("iclrkit", {})
