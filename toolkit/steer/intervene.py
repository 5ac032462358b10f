"""Reading residual-stream activations and steering them during forward passes, through the core hooks.

Activations are read at the output of decoder block l (the residual stream after the block) and the edit is
applied at exactly the same place, so the estimated direction and the intervention live in the same space.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from pathlib import Path
from typing import Iterator, Sequence

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.core.tensorfile import load_tensors, save_tensors
from toolkit.models.view import view_of
from toolkit.nn.hooks import capture, edit_output

OPERATORS = ("add", "ablate", "clip")


def num_layers(model) -> int:
    return len(view_of(model))


def check_layers(model, layers: Sequence[int]) -> list[int]:
    total = num_layers(model)
    require(len(layers) > 0, "give at least one layer")
    for layer in layers:
        require(0 <= layer < total, f"layer {layer} is out of range: the model has {total} blocks (0..{total - 1})")
    return list(layers)


def block_path(model, layer: int) -> str:
    return view_of(model).block_path(layer)


def context_length(model) -> int:
    config = model.config
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))


def encode(tokenizer, texts: Sequence[str], max_tokens: int):
    """Right-padded batch; a text longer than the model's context is an input error, not a silent truncation."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    batch = tokenizer(list(texts), return_tensors="pt", padding=True)
    lengths = batch["attention_mask"].sum(1)
    longest = int(lengths.max())
    if longest > max_tokens:
        index = int(lengths.argmax())
        raise BadInputError(f"text {index + 1} of a batch has {longest} tokens, longer than the model's context "
                            f"of {max_tokens}: {texts[index][:60]!r}...")
    require(int(lengths.min()) > 0, "an example text is empty")
    return batch


@torch.no_grad()
def read_activations(model, tokenizer, texts: Sequence[str], layers: Sequence[int], position: str = "last",
                     batch_size: int = 16, device: str = "cpu") -> dict[int, torch.Tensor]:
    """{layer: (n, d)} residual stream after each block at the last token ('last') or averaged over tokens ('mean')."""
    require(position in ("last", "mean"), f"unknown position '{position}'", "use last or mean")
    require(len(texts) > 0, "no texts to read activations from")
    paths = {layer: block_path(model, layer) for layer in layers}
    rows: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    for start in range(0, len(texts), batch_size):
        batch = encode(tokenizer, texts[start:start + batch_size], context_length(model)).to(device)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        with capture(model, list(paths.values()), what="output") as records:
            model(**batch)
        for layer, path in paths.items():
            hidden = records[path][0].float()
            if position == "last":
                last = batch["attention_mask"].sum(1) - 1
                rows[layer].append(hidden[torch.arange(hidden.shape[0]), last].cpu())
            else:
                rows[layer].append(((hidden * mask).sum(1) / mask.sum(1)).cpu())
    return {layer: torch.cat(parts) for layer, parts in rows.items()}


@torch.no_grad()
def read_activations_onloaded(lazy, tokenizer, texts: Sequence[str], layers: Sequence[int], position: str = "last",
                              batch_size: int = 16, device: str = "cpu", progress=None,
                              probe=None) -> tuple[dict[int, torch.Tensor], str]:
    """(read_activations, model_fingerprint) of a `toolkit.models.lazy.LazyModel` with one block in memory (steer
    --set onload=true): blocks 0..max(layers) are read from the shards one at a time and freed. Each text runs
    unpadded, texts of one length batched together: with right padding and a causal mask the real positions'
    hidden states do not depend on the padding, so the rows are the resident path's (up to rounding)."""
    from toolkit.nn.onload_stats import BlockStream

    require(position in ("last", "mean"), f"unknown position '{position}'", "use last or mean")
    require(len(texts) > 0, "no texts to read activations from")
    ids, by_length = [], {}
    for start in range(0, len(texts), batch_size):
        batch = encode(tokenizer, texts[start:start + batch_size], context_length(lazy.model))
        for row, length in zip(batch["input_ids"], batch["attention_mask"].sum(1).tolist()):
            by_length.setdefault(length, []).append(len(ids))
            ids.append(row[:length])
    stream = BlockStream(lazy, device, probe)
    members = list(by_length.values())
    groups = [stream.windows(torch.stack([ids[i] for i in group]), batch_size) for group in members]
    rows: dict[int, list] = {layer: [None] * len(texts) for layer in layers}

    def after(index, groups):
        if index not in rows:
            return
        for group, inputs in zip(members, groups):
            hidden = torch.cat(inputs.hidden).float()
            for i, row in zip(group, hidden[:, -1] if position == "last" else hidden.mean(1)):
                rows[index][i] = row

    stream.run(groups, last=max(layers), after=after, progress=progress)
    first = next(iter(lazy.layers[0].named_parameters()))[0]
    embedding = lazy.model.get_input_embeddings().weight  # on `device`: summed where a resident model sums it
    fingerprint = _fingerprint(lazy.model.config, embedding,
                               lazy.read(lazy.block_prefix(0) + first).to(embedding.device))
    return {layer: torch.stack(parts) for layer, parts in rows.items()}, fingerprint


def steer_fn(direction: torch.Tensor, alpha: float, operator: str = "add", threshold: float = 0.0):
    """The edit applied to every position's residual stream h:

    - add (the paper's PCMS form, "subtract the mean difference"): h - alpha*v;
    - ablate (projection removal at alpha = 1): h - alpha*(h.u)u with u = v/|v|;
    - clip (an option beyond the paper): h - alpha*max(0, h.u - threshold)*u, which removes only the excess of the
      projection over `threshold`, so positions that do not lean towards the category are left untouched.
    """
    require(operator in OPERATORS, f"unknown operator '{operator}'", f"use one of {', '.join(OPERATORS)}")
    require(torch.isfinite(direction).all().item(), "the steering direction contains NaN/Inf")
    require(math.isfinite(threshold), "the clip threshold must be a finite number")
    if operator == "add":
        def add(hidden: torch.Tensor) -> torch.Tensor:
            return hidden - alpha * direction.to(hidden.device, hidden.dtype)
        return add
    unit = direction / direction.norm().clamp_min(1e-12)

    def ablate(hidden: torch.Tensor) -> torch.Tensor:
        v = unit.to(hidden.device, hidden.dtype)
        return hidden - alpha * (hidden @ v).unsqueeze(-1) * v

    def clip(hidden: torch.Tensor) -> torch.Tensor:
        v = unit.to(hidden.device, hidden.dtype)
        return hidden - alpha * ((hidden @ v) - threshold).clamp_min(0).unsqueeze(-1) * v
    return ablate if operator == "ablate" else clip


def clip_threshold(direction: torch.Tensor, neutral_acts: torch.Tensor) -> float:
    """Mean projection of the neutral examples' activations on u = v/|v|: the level `clip` shrinks towards."""
    unit = direction / direction.norm().clamp_min(1e-12)
    return float((neutral_acts.float() @ unit.float()).mean())


@contextlib.contextmanager
def steering(model, edits: Sequence[tuple[int, torch.Tensor]], alpha: float, operator: str = "add",
             thresholds: Sequence[float] | None = None) -> Iterator[None]:
    """Apply every (layer, direction) edit for the duration of the block (personalisation: several categories
    or layers at once subtract the sum of their directions). `thresholds` (one per edit) are for `clip`."""
    thresholds = list(thresholds) if thresholds is not None else [0.0] * len(edits)
    require(len(thresholds) == len(edits), "give one clip threshold per edit")
    with contextlib.ExitStack() as stack:
        for (layer, direction), threshold in zip(edits, thresholds):
            stack.enter_context(edit_output(model, block_path(model, layer),
                                            steer_fn(direction, alpha, operator, threshold)))
        yield


def model_fingerprint(model) -> str:
    """sha256 (16 hex) of the architecture and a checksum of the embedding and first-block weights, so a direction
    is never applied to a different model by accident."""
    return _fingerprint(model.config, model.get_input_embeddings().weight,
                        next(model.get_submodule(block_path(model, 0)).parameters()))


def _fingerprint(config, embedding: torch.Tensor, first_block: torch.Tensor) -> str:
    keys = ("model_type", "hidden_size", "num_hidden_layers", "n_layer", "n_embd", "vocab_size")
    digest = hashlib.sha256(json.dumps({k: getattr(config, k, None) for k in keys}, sort_keys=True).encode())
    embedding, first_block = embedding.detach().float(), first_block.detach().float()
    digest.update(f"{embedding.sum().item():.6e}|{embedding.abs().sum().item():.6e}".encode())
    digest.update(f"{first_block.sum().item():.6e}|{first_block.abs().sum().item():.6e}".encode())
    return digest.hexdigest()[:16]


def save_directions(path: Path, directions: dict[int, torch.Tensor], metadata: dict) -> None:
    save_tensors(path, {f"layer.{layer}": v for layer, v in directions.items()},
                 {k: str(v) for k, v in metadata.items()})


def load_directions(path: str | Path) -> tuple[dict[int, torch.Tensor], dict]:
    tensors, metadata = load_tensors(Path(path), "direction file")
    directions = {int(key.split(".", 1)[1]): value for key, value in tensors.items()}
    require(bool(directions), f"{path} holds no directions")
    return directions, metadata
