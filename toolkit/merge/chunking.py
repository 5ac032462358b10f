"""Layer-aware chunking: a state dict -> fixed-size tokens that never cross a tensor (layer) boundary, and back.

Each encoded tensor is normalised by its own mean and standard deviation (computed and applied in float64, so the
inverse is bit-exact after casting back), flattened row-major and padded at ITS end to a multiple of the chunk size.
Every token carries the index of the layer (module) it came from, a tensor-type id and its position inside the
tensor: the VAE embeds them. The official code concatenates all tensors and pads once at the very end, so its
chunks straddle tensors (shared/techniques/merge-latent.md, pitfall 3); here chunks are aligned per tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TYPE_IDS = {"linear": 0, "conv": 1, "embedding": 2, "vector": 3, "other": 4}


@dataclass(frozen=True)
class TensorSlot:
    name: str
    shape: tuple[int, ...]
    dtype: str
    layer: int
    type_id: int
    first_token: int
    n_tokens: int


@dataclass
class Chunked:
    """Tokens (n_tokens, chunk) float64, a per-element validity mask, token ids and the inverse recipe."""

    tokens: torch.Tensor
    valid: torch.Tensor
    layer_ids: torch.Tensor
    type_ids: torch.Tensor
    positions: torch.Tensor
    slots: list[TensorSlot]
    means: torch.Tensor
    stds: torch.Tensor

    def signature(self) -> list[list]:
        """What must match for a VAE to decode these tokens: names and shapes in order."""
        return [[s.name, list(s.shape)] for s in self.slots]


def is_encoded(name: str, exclude: list[str]) -> bool:
    """The paper's rule: tensors whose name contains an excluded fragment (bias, norm, ln) stay in weight space."""
    return not any(fragment in name for fragment in exclude)


def type_of(name: str, tensor: torch.Tensor) -> int:
    if tensor.ndim == 4:
        return TYPE_IDS["conv"]
    if "embed" in name or "wte" in name or "wpe" in name:
        return TYPE_IDS["embedding"]
    if tensor.ndim == 2:
        return TYPE_IDS["linear"]
    return TYPE_IDS["vector"] if tensor.ndim == 1 else TYPE_IDS["other"]


def chunk_state(state: dict[str, torch.Tensor], chunk: int, exclude: list[str]) -> Chunked:
    names = [n for n, t in state.items() if t.is_floating_point() and is_encoded(n, exclude)]
    if not names:
        from toolkit.core.errors import BadInputError

        raise BadInputError("no tensor left to encode: every parameter name matches the exclude list")
    modules: dict[str, int] = {}
    slots, pieces, masks, layer_ids, type_ids, positions, means, stds = [], [], [], [], [], [], [], []
    first = 0
    for name in names:
        tensor = state[name]
        layer = modules.setdefault(name.rsplit(".", 1)[0], len(modules))
        flat = tensor.detach().reshape(-1).to(torch.float64)
        mean = flat.mean()
        std = flat.std() if flat.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        std = std if std > 0 else torch.tensor(1.0, dtype=torch.float64)
        n_tokens = -(-flat.numel() // chunk)
        padded = torch.zeros(n_tokens * chunk, dtype=torch.float64)
        padded[:flat.numel()] = (flat - mean) / std
        valid = torch.zeros(n_tokens * chunk, dtype=torch.bool)
        valid[:flat.numel()] = True
        kind = type_of(name, tensor)
        slots.append(TensorSlot(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), layer, kind,
                                first, n_tokens))
        pieces.append(padded.view(n_tokens, chunk))
        masks.append(valid.view(n_tokens, chunk))
        layer_ids.append(torch.full((n_tokens,), layer))
        type_ids.append(torch.full((n_tokens,), kind))
        positions.append(torch.arange(n_tokens))
        means.append(mean)
        stds.append(std)
        first += n_tokens
    return Chunked(torch.cat(pieces), torch.cat(masks), torch.cat(layer_ids), torch.cat(type_ids),
                   torch.cat(positions), slots, torch.stack(means), torch.stack(stds))


def unchunk(tokens: torch.Tensor, slots: list[TensorSlot], means: torch.Tensor,
            stds: torch.Tensor) -> dict[str, torch.Tensor]:
    """The exact inverse of chunk_state for the encoded tensors (tokens may come from a decoder)."""
    out = {}
    tokens = tokens.to(torch.float64)
    for slot, mean, std in zip(slots, means, stds):
        numel = 1
        for dim in slot.shape:
            numel *= dim
        flat = tokens[slot.first_token:slot.first_token + slot.n_tokens].reshape(-1)[:numel]
        out[slot.name] = (flat * std + mean).to(getattr(torch, slot.dtype)).reshape(slot.shape)
    return out


def windows(chunked: Chunked, length: int) -> dict[str, torch.Tensor]:
    """Consecutive tokens grouped into windows of `length` (the VAE's sequence); the tail window is masked."""
    n = chunked.tokens.shape[0]
    n_windows = -(-n // length)
    pad = n_windows * length - n

    def padded(t: torch.Tensor, fill=0) -> torch.Tensor:
        tail = torch.full((pad, *t.shape[1:]), fill, dtype=t.dtype)
        return torch.cat([t, tail]).view(n_windows, length, *t.shape[1:])

    return {"x": padded(chunked.tokens.float()), "valid": padded(chunked.valid, False),
            "layer": padded(chunked.layer_ids), "type": padded(chunked.type_ids),
            "pos": padded(chunked.positions), "token_mask": padded(torch.ones(n, dtype=torch.bool), False)}


def from_windows(x: torch.Tensor, n_tokens: int) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])[:n_tokens]
