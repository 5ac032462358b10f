"""Dimensionality-matching projection: bring a model of another width into a target model's layout.

The paper does not release its projection; this is our design (shared/techniques/merge-latent.md, [recon]). For a
chain of linear layers (an MLP), every hidden unit of the source is assigned to one slot of the target layer by
weight matching (Git Re-Basin style coordinate ascent on <W_target, P W_source Pᵀ>, rectangular Hungarian
assignments); target slots left without a source unit get zero weights in and out, so widening is exactly
function-preserving, and narrowing keeps the source units that match the target best. Without alignment the
assignment is the identity: pad at the end or truncate, the naive baseline.
"""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError, require


def linear_chain(state: dict[str, torch.Tensor]) -> list[tuple[str, str | None]]:
    """(weight, bias) names of consecutive 2-D weights whose input size is the previous output size."""
    chain = [(n, n[:-len("weight")] + "bias" if n.endswith("weight") and n[:-len("weight")] + "bias" in state
              else None) for n, t in state.items() if t.ndim == 2]
    require(len(chain) >= 2, "the dimensionality-matching projection needs a chain of at least two linear layers")
    for (prev, _), (cur, _) in zip(chain, chain[1:]):
        require(state[cur].shape[1] == state[prev].shape[0],
                f"'{cur}' does not consume the output of '{prev}': not a plain linear chain")
    require(len(chain) * 2 - sum(b is None for _, b in chain) == len(state),
            "the projection handles MLPs (linear weights and biases only); merge this family at equal sizes")
    return chain


def is_linear_chain(state: dict[str, torch.Tensor]) -> bool:
    try:
        linear_chain(state)
    except BadInputError:
        return False
    return True


def _take(matrix: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows/columns of `matrix` picked by `index` (-1 = a zero row/column)."""
    safe = index.clamp(min=0)
    picked = matrix.index_select(dim, safe)
    keep = (index >= 0).to(matrix.dtype)
    return picked * (keep.unsqueeze(1) if dim == 0 else keep.unsqueeze(0))


def identity_match(target_size: int, source_size: int) -> torch.Tensor:
    match = torch.arange(target_size)
    match[match >= source_size] = -1
    return match


def weight_matching(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                    max_rounds: int = 30) -> list[torch.Tensor]:
    """One index vector per hidden layer: for each target unit, the source unit placed there (or -1)."""
    from scipy.optimize import linear_sum_assignment

    chain = linear_chain(target)
    src = [(source[w].double(), source[b].double() if b else None) for w, b in chain]
    tgt = [(target[w].double(), target[b].double() if b else None) for w, b in chain]
    n_in = tgt[0][0].shape[1]
    hidden = len(chain) - 1
    matches = [identity_match(tgt[i][0].shape[0], src[i][0].shape[0]) for i in range(hidden)]
    full = lambda i: matches[i] if 0 <= i < hidden else torch.arange(n_in if i < 0 else tgt[-1][0].shape[0])  # noqa: E731
    for _ in range(max_rounds):
        changed = False
        for layer in range(hidden):
            w_in = _take(src[layer][0], full(layer - 1), 1)
            score = tgt[layer][0] @ w_in.T
            if tgt[layer][1] is not None:
                score += torch.outer(tgt[layer][1], src[layer][1])
            score += tgt[layer + 1][0].T @ _take(src[layer + 1][0], full(layer + 1), 0)
            rows, cols = linear_sum_assignment(score.numpy(), maximize=True)
            match = torch.full((score.shape[0],), -1, dtype=torch.long)
            match[torch.as_tensor(rows)] = torch.as_tensor(cols, dtype=torch.long)
            changed |= not torch.equal(match, matches[layer])
            matches[layer] = match
        if not changed:
            break
    return matches


def project(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor], align: bool) -> dict[str, torch.Tensor]:
    """`source` re-laid into `target`'s shapes: aligned by weight matching, or padded/truncated at the end."""
    chain = linear_chain(target)
    require([n for n, _ in linear_chain(source)] == [n for n, _ in chain],
            "source and target MLPs have different layer names or depths")
    if source[chain[0][0]].shape[1] != target[chain[0][0]].shape[1] or \
            source[chain[-1][0]].shape[0] != target[chain[-1][0]].shape[0]:
        raise BadInputError("models with different input or output sizes cannot be projected onto each other")
    hidden = len(chain) - 1
    matches = weight_matching(source, target) if align else [
        identity_match(target[chain[i][0]].shape[0], source[chain[i][0]].shape[0]) for i in range(hidden)]
    out = {}
    for i, (w_name, b_name) in enumerate(chain):
        weight = source[w_name]
        if i < hidden:
            weight = _take(weight, matches[i], 0)
        if i > 0:
            weight = _take(weight, matches[i - 1], 1)
        out[w_name] = weight
        if b_name:
            out[b_name] = _take(source[b_name].unsqueeze(1), matches[i], 0).squeeze(1) if i < hidden \
                else source[b_name].clone()
    return {name: out[name] for name in target}


def pad_or_truncate(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Any tensor to `shape`: zeros appended or entries cut at the end of every dimension (the naive baseline)."""
    require(tensor.ndim == len(shape), f"cannot pad a {tensor.ndim}-D tensor to {len(shape)}-D")
    out = torch.zeros(shape, dtype=tensor.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(tensor.shape, shape))
    out[common] = tensor[common]
    return out
