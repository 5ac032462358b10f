"""Save a produced model so `from_pretrained` loads it: safetensors shards, config, tokenizer, generation config, card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def save_model(model, tokenizer, out: Path, *, technique: str, source: str, paper: str = "", command: str = "",
               notes: str = "", metadata: dict[str, Any] | None = None, max_shard_size: str = "2GB") -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if metadata:
        setattr(model.config, "iclrkit", metadata)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    generation = getattr(model, "generation_config", None)
    if generation is not None and not (out / "generation_config.json").exists():
        generation.save_pretrained(out)
    (out / "README.md").write_text(CARD.format(title=f"{technique}: {Path(str(source)).name}", technique=technique,
                                               source=source, paper=paper or "-", command=command or "-",
                                               notes=notes))
    return out


def read_metadata(path: Path) -> dict[str, Any]:
    config = json.loads((Path(path) / "config.json").read_text())
    return config.get("iclrkit", {})
