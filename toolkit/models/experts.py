"""Fused mixture-of-experts tensors (transformers 5 `*Experts`: `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I],
`act_fn`), seen one expert at a time: which tokens the router sends each expert, and each expert's inputs to its
gate/up and down projections, computed as the module's own forward computes them (checked numerically once per
model by `check_experts`)."""

from __future__ import annotations

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError


def routed_tokens(top_k_index: torch.Tensor, experts: int) -> list[torch.Tensor]:
    """Per expert, the (sorted, unique) token positions the router sent it; top_k_index [T, k]."""
    flat = top_k_index.reshape(top_k_index.shape[0], -1)
    return [torch.nonzero((flat == e).any(dim=-1)).flatten() for e in range(experts)]


def gate_up_inputs(hidden: torch.Tensor, top_k_index: torch.Tensor, experts: int,
                   all_tokens: bool = False) -> list[torch.Tensor]:
    """Each expert's gate/up input: the hidden states of its routed tokens (every token with `all_tokens`)."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    if all_tokens:
        return [hidden] * experts
    return [hidden[tokens] for tokens in routed_tokens(top_k_index, experts)]


def down_input(module: nn.Module, expert: int, x: torch.Tensor) -> torch.Tensor:
    """act(gate) * up for expert `expert` on its gate/up input x (with the module's current weights)."""
    gate, up = nn.functional.linear(x, module.gate_up_proj[expert]).chunk(2, dim=-1)
    return module.act_fn(gate) * up


def expert_forward(module: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                   top_k_weights: torch.Tensor) -> torch.Tensor:
    """The module's output recomputed expert by expert (the reference `check_experts` compares against)."""
    out = torch.zeros_like(hidden)
    experts = module.gate_up_proj.shape[0]
    for e, tokens in enumerate(routed_tokens(top_k_index, experts)):
        if tokens.numel() == 0:
            continue
        y = nn.functional.linear(down_input(module, e, hidden[tokens]), module.down_proj[e])
        weight = (top_k_weights[tokens] * (top_k_index[tokens] == e)).sum(-1, keepdim=True)
        out.index_add_(0, tokens, (y * weight).to(out.dtype))
    return out


def check_experts(module: nn.Module, model_type: str) -> None:
    """Refuse a fused experts module whose forward is not gate_up → act(gate)·up → down, routed by top-k (the layout
    every per-expert computation here assumes)."""
    gate_up, down = module.gate_up_proj, module.down_proj
    experts, two_i, hidden = gate_up.shape
    if down.shape != (experts, hidden, two_i // 2) or two_i % 2 or not hasattr(module, "act_fn"):
        raise BadInputError(f"{model_type}: fused expert tensors gate_up_proj {tuple(gate_up.shape)} and down_proj "
                            f"{tuple(down.shape)} are not [E, 2I, H] and [E, H, I] with an act_fn")
    generator = torch.Generator().manual_seed(0)
    tokens, k = 6, min(2, experts)
    x = torch.randn(tokens, hidden, generator=generator).to(device=gate_up.device, dtype=gate_up.dtype)
    index = torch.stack([torch.randperm(experts, generator=generator)[:k] for _ in range(tokens)]).to(gate_up.device)
    weights = torch.rand(tokens, k, generator=generator).to(device=gate_up.device, dtype=gate_up.dtype)
    with torch.no_grad():
        expected = module(x, index, weights)
        ours = expert_forward(module, x, index, weights)
    if not torch.allclose(expected.float(), ours.float(), rtol=1e-3, atol=1e-4 * float(expected.abs().max()) + 1e-6):
        raise BadInputError(f"{model_type}: the fused experts' forward is not the gate_up → act(gate)·up → down "
                            f"layout this toolkit computes per expert (max diff "
                            f"{(expected.float() - ours.float()).abs().max():.3g})")


# -- on-disk names: checkpoints (and the engines' formats) name experts one by one ---------------------------------

def _conversions(model_type: str):
    """(renamings [(disk, memory)], converters [(memory suffix, [disk patterns with *])]) from transformers' own
    checkpoint conversion mapping for this model type (None when it has none: names on disk are the fused ones)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return None
    mapping = get_checkpoint_conversion_mapping(model_type)
    if not mapping:
        return None
    renamings, converters = [], []
    for item in mapping:
        sources, targets = list(item.source_patterns), list(item.target_patterns)
        if type(item).__name__ == "WeightRenaming":
            if any(ch in "".join(sources + targets) for ch in "^$()[]\\+?|"):
                continue  # a regex renaming (vision towers, prefixes): not one that touches decoder experts
            renamings.append((sources[0], targets[0]))
        elif type(item).__name__ == "WeightConverter":
            ops = [type(o).__name__ for o in (item.operations or [])]
            if ops not in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]):
                raise BadInputError(f"{model_type}: expert checkpoint conversion {ops} is not one this toolkit "
                                    "inverts (stacked experts, optionally gate/up concatenated)")
            converters.append((targets[0].lstrip("."), [s.lstrip(".") for s in sources]))
    return renamings, converters


def disk_name(model_type: str, name: str) -> str:
    """The checkpoint name of an in-memory tensor name (the renamings undone: Mixtral's mlp → block_sparse_moe)."""
    conversions = _conversions(model_type)
    if conversions is None:
        return name
    for disk, memory in conversions[0]:
        name = name.replace(memory, disk)
    return name


def expert_disk_names(model_type: str, fused: str, expert: int, rows: int) -> list[tuple[str, slice]]:
    """The checkpoint tensors one expert's slice of fused tensor `fused` (its in-memory name, e.g.
    model.layers.0.mlp.experts.gate_up_proj) is stored as, each with the rows of the slice it holds: Mixtral's
    gate_up_proj[e] = w1 (first half of the rows) + w3; Qwen-MoE's gate_proj + up_proj; down_proj[e] = w2 /
    down_proj. Module names without `.weight` (the formats add their own suffixes)."""
    conversions = _conversions(model_type)
    if conversions is not None:
        for target, sources in conversions[1]:
            if fused.endswith(target):
                base = fused[:-len(target)]
                if rows % len(sources):
                    raise BadInputError(f"{fused}: {rows} rows do not split into {len(sources)} checkpoint tensors")
                share = rows // len(sources)
                return [(disk_name(model_type, base + source.replace("*", str(expert)).removesuffix(".weight")),
                         slice(k * share, (k + 1) * share)) for k, source in enumerate(sources)]
    raise BadInputError(f"{model_type}: no per-expert checkpoint names known for {fused}",
                        "export the packed or dense format")
