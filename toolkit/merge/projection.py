"""Dimensionality-matching projection: bring a model of another width into a target model's layout.

The paper does not release its projection; this is our design (shared/techniques/merge-latent.md, [recon]).

Chains of linear and convolution layers (digits MLPs and CNNs): every hidden unit (MLP neuron or conv output
channel) of the source is assigned to one slot of the target layer by weight matching (Git Re-Basin style coordinate
ascent on <W_target, P W_source Pᵀ>, rectangular Hungarian assignments; a conv kernel or the block of head columns
a channel feeds after flattening moves with its channel). Target slots left without a source unit get zero weights
in and out, so widening is exactly function-preserving, and narrowing keeps the source units that match the target
best. Without alignment the assignment is the identity: pad at the end or truncate, the naive baseline.

GPT-2 (residual stream, LayerNorm, fused attention heads): zero-padding is not function-preserving (LayerNorm
statistics change), so widening by an integer factor k duplicates every unit k times (Net2Net, Chen et al., ICLR 2016,
https://arxiv.org/abs/1511.05641): the residual stream becomes [x, ..., x], which keeps LayerNorm exact; readers of
duplicated units divide by k, queries are scaled by 1/sqrt(k) for the wider heads' 1/sqrt(head_dim), and the final
LayerNorm is scaled by 1/k for the tied output embedding. The widened model computes the same logits.

Depth: a model shallower than the target is first deepened with identity layers (deepen.py, Net2DeeperNet), so
widths and depths both map into the target's layout; a deeper model is refused rather than truncated.
"""

from __future__ import annotations

import math

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.merge.deepen import match_depth


# ------------------------------------------------------------------ linear / conv chains
def unit_chain(state: dict[str, torch.Tensor]) -> list[tuple[str, str | None]]:
    """(weight, bias) names of consecutive linear (2-D) / conv (4-D) weights, each consuming the previous one's units:
    a conv or linear weight whose input size is the previous output size, or a linear layer after a conv reading the
    flattened channels (input size a multiple of the channel count, channel-major)."""
    chain = [(n, n[:-len("weight")] + "bias" if n.endswith("weight") and n[:-len("weight")] + "bias" in state
              else None) for n, t in state.items() if t.ndim in (2, 4)]
    require(len(chain) >= 2, "the dimensionality-matching projection needs a chain of at least two linear layers")
    for (prev, _), (cur, _) in zip(chain, chain[1:]):
        units, w = state[prev].shape[0], state[cur]
        flattened = state[prev].ndim == 4 and w.ndim == 2 and w.shape[1] % units == 0
        require(w.shape[1] == units or flattened,
                f"'{cur}' does not consume the output of '{prev}': not a plain linear/conv chain")
    require(len(chain) * 2 - sum(b is None for _, b in chain) == len(state),
            "the projection handles linear layers and convolutions (weights and biases only); merge this family at "
            "equal sizes")
    return chain


def is_unit_chain(state: dict[str, torch.Tensor]) -> bool:
    try:
        unit_chain(state)
    except BadInputError:
        return False
    return True


def _as_units(weight: torch.Tensor, n_in: int) -> torch.Tensor:
    """(out units, in units, rest): a conv kernel or a flattened channel block is the `rest` of one unit pair."""
    return weight.reshape(weight.shape[0], n_in, -1)


def _take(matrix: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """Slices of `matrix` along `dim` picked by `index` (-1 = a zero slice)."""
    safe = index.clamp(min=0)
    picked = matrix.index_select(dim, safe)
    shape = [1] * matrix.ndim
    shape[dim] = -1
    return picked * (index >= 0).to(matrix.dtype).view(shape)


def identity_match(target_size: int, source_size: int) -> torch.Tensor:
    match = torch.arange(target_size)
    match[match >= source_size] = -1
    return match


def _unit_views(state: dict[str, torch.Tensor], chain) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    views, n_in = [], state[chain[0][0]].shape[1]
    for w, b in chain:
        views.append((_as_units(state[w].double(), n_in), state[b].double() if b else None))
        n_in = state[w].shape[0]
    return views


def weight_matching(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor],
                    max_rounds: int = 30) -> list[torch.Tensor]:
    """One index vector per hidden layer: for each target unit, the source unit placed there (or -1)."""
    from scipy.optimize import linear_sum_assignment

    chain = unit_chain(target)
    src, tgt = _unit_views(source, chain), _unit_views(target, chain)
    hidden = len(chain) - 1
    matches = [identity_match(tgt[i][0].shape[0], src[i][0].shape[0]) for i in range(hidden)]
    n_in, n_out = tgt[0][0].shape[1], tgt[-1][0].shape[0]
    full = lambda i: matches[i] if 0 <= i < hidden else torch.arange(n_in if i < 0 else n_out)  # noqa: E731
    for _ in range(max_rounds):
        changed = False
        for layer in range(hidden):
            w_in = _take(src[layer][0], full(layer - 1), 1)
            score = torch.einsum("tir,sir->ts", tgt[layer][0], w_in)
            if tgt[layer][1] is not None:
                score += torch.outer(tgt[layer][1], src[layer][1])
            w_out = _take(src[layer + 1][0], full(layer + 1), 0)
            score += torch.einsum("otr,osr->ts", tgt[layer + 1][0], w_out)
            rows, cols = linear_sum_assignment(score.numpy(), maximize=True)
            match = torch.full((score.shape[0],), -1, dtype=torch.long)
            match[torch.as_tensor(rows)] = torch.as_tensor(cols, dtype=torch.long)
            changed |= not torch.equal(match, matches[layer])
            matches[layer] = match
        if not changed:
            break
    return matches


def duplicate_fill(matches: list[torch.Tensor], source: dict[str, torch.Tensor],
                   target: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Widening without empty units: every target slot left without a source unit takes a copy of the source unit
    whose incoming weights (and bias) match the slot best; `project` splits the copies' outgoing weights."""
    chain = unit_chain(target)
    src, tgt = _unit_views(source, chain), _unit_views(target, chain)
    filled = []
    for layer, match in enumerate(matches):
        inputs = filled[layer - 1] if layer else torch.arange(tgt[0][0].shape[1])
        score = torch.einsum("tir,sir->ts", tgt[layer][0], _take(src[layer][0], inputs, 1))
        if tgt[layer][1] is not None:
            score += torch.outer(tgt[layer][1], src[layer][1])
        match = match.clone()
        empty = match < 0
        match[empty] = score[empty].argmax(1)
        filled.append(match)
    return filled


def project(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor], align: bool,
            fill: str = "zero") -> dict[str, torch.Tensor]:
    """`source` re-laid into `target`'s shapes: aligned by weight matching, or padded/truncated at the end. When
    widening with alignment, fill="duplicate" fills the spare slots with copies of source units (outgoing weights
    split among the copies, still function-preserving) instead of zero units."""
    chain = unit_chain(target)
    require([n for n, _ in unit_chain(source)] == [n for n, _ in chain],
            "source and target models have different layer names or depths")
    n_in = target[chain[0][0]].shape[1]
    if source[chain[0][0]].shape[1] != n_in or source[chain[-1][0]].shape[0] != target[chain[-1][0]].shape[0]:
        raise BadInputError("models with different input or output sizes cannot be projected onto each other")
    hidden = len(chain) - 1
    matches = weight_matching(source, target) if align else [
        identity_match(target[chain[i][0]].shape[0], source[chain[i][0]].shape[0]) for i in range(hidden)]
    if align and fill == "duplicate":
        matches = duplicate_fill(matches, source, target)
    copies = [torch.bincount(m[m >= 0], minlength=source[w].shape[0]).clamp(min=1)[m.clamp(min=0)]
              for m, (w, _) in zip(matches, chain)]
    out, src_in = {}, n_in
    for i, (w_name, b_name) in enumerate(chain):
        weight = _as_units(source[w_name], src_in)
        src_in = source[w_name].shape[0]
        if i < hidden:
            weight = _take(weight, matches[i], 0)
        if i > 0:
            weight = _take(weight, matches[i - 1], 1) / copies[i - 1].to(weight.dtype).view(1, -1, 1)
        out[w_name] = weight.reshape(target[w_name].shape)
        if b_name:
            out[b_name] = _take(source[b_name], matches[i], 0) if i < hidden else source[b_name].clone()
    return {name: out[name] for name in target}


def pad_or_truncate(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Any tensor to `shape`: zeros appended or entries cut at the end of every dimension (the naive baseline)."""
    require(tensor.ndim == len(shape), f"cannot pad a {tensor.ndim}-D tensor to {len(shape)}-D")
    out = torch.zeros(shape, dtype=tensor.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(tensor.shape, shape))
    out[common] = tensor[common]
    return out


# ------------------------------------------------------------------ GPT-2
def duplicate_index(size: int, factor: int, block: int | None = None) -> torch.Tensor:
    """Source index of every unit after duplicating `factor` times: blocks of `block` units are repeated in place
    (a head's dimensions stay inside the head); block=None repeats the whole vector."""
    block = block or size
    groups = torch.arange(size).view(-1, block)
    return groups.repeat(1, factor).reshape(-1)


def widen_gpt2(source: dict[str, torch.Tensor], heads: int, width: int) -> dict[str, torch.Tensor]:
    """A GPT-2 state dict (Conv1D weights (in, out)) widened to n_embd `width` with the same number of heads,
    computing the same function (Net2Net duplication; the module docstring gives the rescalings)."""
    d = source["transformer.wte.weight"].shape[1]
    require(width % d == 0, f"GPT-2 widths {d} -> {width}: the widening needs an integer factor")
    require(d % heads == 0, f"n_embd {d} is not a multiple of n_head {heads}")
    k = width // d
    resid = duplicate_index(d, k)
    head = duplicate_index(d, k, block=d // heads)
    out = {}
    for name, tensor in source.items():
        t = tensor.double()
        if name in ("transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"):
            t = t[:, resid]
        elif name.endswith(("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias")):
            t = t[resid]
        elif name.startswith("transformer.ln_f."):
            t = t[resid] / k  # the tied output embedding reads k copies
        elif name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
            parts = list(t.split(d, dim=-1))
            parts = [p[..., head] for p in parts]
            parts[0] = parts[0] / math.sqrt(k)  # k-fold dot products under 1/sqrt(k·head_dim) scaling
            t = torch.cat(parts, dim=-1)
            if t.ndim == 2:
                t = t[resid] / k
        elif name.endswith("attn.c_proj.weight"):
            t = t[head][:, resid] / k
        elif name.endswith("mlp.c_fc.weight"):
            t = t[resid][:, duplicate_index(t.shape[1], k)] / k
        elif name.endswith("mlp.c_fc.bias"):
            t = t[duplicate_index(t.shape[0], k)]
        elif name.endswith("mlp.c_proj.weight"):
            t = t[duplicate_index(t.shape[0], k)][:, resid] / k
        elif name.endswith(("attn.c_proj.bias", "mlp.c_proj.bias")):
            t = t[resid]
        else:
            raise BadInputError(f"GPT-2 widening does not know the tensor '{name}'")
        out[name] = t.to(tensor.dtype)
    return out


# ------------------------------------------------------------------ dispatch
def lay_out(source, target, align: bool, fill: str = "zero") -> dict[str, torch.Tensor]:
    """`source` (a PlainModel) in `target`'s layout: first deepened to the target's depth with identity layers
    (deepen.py; a deeper source is refused), then its own state when the shapes already match (unit matching
    only for linear/conv chains), else the family's projection when `align` (`fill`: spare slots of a widened
    linear/conv chain as zero units or as copies), else zero-pad/truncate."""
    source = match_depth(source, target)
    require(set(source.state) == set(target.state),
            f"{source.source} and the target have different parameter names: not one architecture family")
    same = all(source.state[n].shape == t.shape for n, t in target.state.items())
    chain = is_unit_chain(target.state)
    if same and not (align and chain):
        return {n: source.state[n] for n in target.state}
    if chain:
        return project(source.state, target.state, align=align, fill=fill)
    if not align:
        return {n: pad_or_truncate(source.state[n], tuple(t.shape)) for n, t in target.state.items()}
    require(source.family == "hf-gpt2", f"no dimensionality-matching projection for {source.family} models of "
            "different sizes", hint="use --no-align (zero-pad/truncate)")
    require(source.arch.get("n_head") == target.arch.get("n_head") and
            source.arch.get("n_layer") == target.arch.get("n_layer"),
            "GPT-2 widening keeps the number of heads and layers: the models differ in them")
    widened = widen_gpt2(source.state, source.arch["n_head"], target.arch["n_embd"])
    require(all(widened[n].shape == t.shape for n, t in target.state.items()),
            "the widened GPT-2 does not match the target's shapes (vocabulary, positions or MLP ratio differ)")
    return {n: widened[n] for n in target.state}
