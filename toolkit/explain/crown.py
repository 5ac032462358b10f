"""IBP and backward CROWN bounds for an AffineNet over a batch of input domains, including the
cardinality-constrained domain Omega_m of FAME (arXiv 2603.10661, Sec. 4).

A batch row is a domain around one point x0 inside the box [l, u] = [max(x0-eps, 0), min(x0+eps, 1)]:
  - features in `free` range over the box,
  - at most `m` of the features in `candidate` may also range over the box,
  - every other feature is fixed at x0.
`free` and `candidate` are disjoint; the plain box of a free set F is the row (free=F, candidate=empty, m=0).

A linear form a.x + a0 attains its maximum over such a domain at
  a.x0 + a0 + sum_{j in free} s_j + (sum of the m largest s_j over candidates),
with s_j = sum over the channels of pixel j of max(a, 0)(u - x0) + min(a, 0)(l - x0) >= 0. Every intermediate
pre-activation bound is concretised this way too: that is where Omega_m tightens CROWN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.explain.net import AffineNet


@dataclass
class Domain:
    """B input domains around one point; see the module docstring."""

    center: torch.Tensor  # (n,) float64
    lower: torch.Tensor  # (n,) box lower end
    upper: torch.Tensor  # (n,) box upper end
    feature: torch.Tensor  # (n,) long: pixel index of each input coordinate
    free: torch.Tensor  # (B, P) bool
    candidate: torch.Tensor  # (B, P) bool
    m: torch.Tensor  # (B,) long

    @property
    def batch(self) -> int:
        return self.free.shape[0]

    @property
    def n_features(self) -> int:
        return self.free.shape[1]

    def rows(self, index: torch.Tensor) -> Domain:
        return Domain(self.center, self.lower, self.upper, self.feature, self.free[index], self.candidate[index],
                      self.m[index])


def epsilon_box(x0: torch.Tensor, eps: float, lo: float = 0.0, hi: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The L-inf ball of radius eps around x0, clipped to the valid input range [lo, hi]."""
    return (x0 - eps).clamp(min=lo), (x0 + eps).clamp(max=hi)


def box_domains(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                free: torch.Tensor) -> Domain:
    """Plain boxes: row b lets exactly the features in free[b] move."""
    free = free.reshape(-1, net.n_features).bool()
    batch = free.shape[0]
    return Domain(x0.double(), lower.double(), upper.double(), net.feature_of_input(), free,
                  torch.zeros_like(free), torch.zeros(batch, dtype=torch.long))


def cardinality_domains(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                        free: torch.Tensor, ms: torch.Tensor) -> Domain:
    """Omega_m(x0; F) for every m in `ms`: F = `free` moves, plus any m of the remaining features."""
    free = free.reshape(1, -1).bool().expand(len(ms), -1).clone()
    return Domain(x0.double(), lower.double(), upper.double(), net.feature_of_input(), free, ~free,
                  torch.as_tensor(ms, dtype=torch.long))


def top_m_sum(values: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Sum of the m[b] largest entries along the last axis of values[b, ...] (m = 0 gives 0)."""
    ordered = values.sort(dim=-1, descending=True).values
    cumulative = torch.cat([torch.zeros_like(ordered[..., :1]), ordered.cumsum(-1)], dim=-1)
    index = m.clamp(max=values.shape[-1]).reshape(-1, *([1] * (values.dim() - 1)))
    return cumulative.gather(-1, index.expand(*values.shape[:-1], 1)).squeeze(-1)


def feature_slack(domain: Domain, coeffs: torch.Tensor) -> torch.Tensor:
    """s_j >= 0: the most that freeing pixel j can raise the linear form `coeffs` (B, S, n) -> (B, S, P)."""
    rise = torch.where(coeffs > 0, coeffs * (domain.upper - domain.center), coeffs * (domain.lower - domain.center))
    if rise.shape[-1] == domain.n_features:  # one channel: input coordinates are the pixels
        return rise
    slack = torch.zeros(*coeffs.shape[:2], domain.n_features, dtype=coeffs.dtype)
    return slack.index_add_(2, domain.feature, rise)


def concretize_upper(domain: Domain, coeffs: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """max over each row's domain of coeffs[b, s].x + offset[b, s]  -> (B, S)."""
    if _rows_share_all_but_m(domain, coeffs):  # Omega_m for many m: sort the slacks once, read each m's prefix
        slack = feature_slack(domain.rows(torch.tensor([0])), coeffs[:1])
        value = coeffs[:1] @ domain.center + offset + (slack * domain.free[:1, None, :]).sum(-1)
        ordered = (slack * domain.candidate[:1, None, :]).sort(dim=-1, descending=True).values
        cumulative = torch.cat([torch.zeros_like(ordered[..., :1]), ordered.cumsum(-1)], dim=-1)[0]
        return value + cumulative[:, domain.m.clamp(max=domain.n_features)].T
    slack = feature_slack(domain, coeffs)
    value = coeffs @ domain.center + offset
    value = value + (slack * domain.free[:, None, :]).sum(-1)
    return value + top_m_sum(slack * domain.candidate[:, None, :], domain.m)


def _rows_share_all_but_m(domain: Domain, coeffs: torch.Tensor) -> bool:
    return (domain.batch > 1 and coeffs.stride(0) == 0 and bool((domain.free == domain.free[:1]).all())
            and bool((domain.candidate == domain.candidate[:1]).all()))


def concretize_bounds(domain: Domain, coeffs: torch.Tensor, offset: torch.Tensor):
    negated = (-coeffs[:1]).expand_as(coeffs) if coeffs.stride(0) == 0 else -coeffs  # keep rows shared
    return -concretize_upper(domain, negated, -offset), concretize_upper(domain, coeffs, offset)


def relu_relaxation(lo: torch.Tensor, hi: torch.Tensor):
    """CROWN's linear ReLU relaxation: upper line su*z + tu (the chord), lower line sl*z with the adaptive slope
    (1 when u >= -l, else 0); stable neurons are exact."""
    active, inactive = lo >= 0, hi <= 0
    unstable = ~active & ~inactive
    chord = hi / (hi - lo).where(unstable, torch.ones_like(hi))
    su = torch.where(active, 1.0, torch.where(unstable, chord, 0.0)).to(lo.dtype)
    tu = torch.where(unstable, -chord * lo, 0.0).to(lo.dtype)
    sl = torch.where(active, 1.0, torch.where(unstable & (hi >= -lo), 1.0, 0.0)).to(lo.dtype)
    return su, tu, sl


def backward_linear(net: AffineNet, spec: torch.Tensor, layer: int, pre_bounds: list) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear upper bound spec[b].z_layer <= A[b].x + a0[b] valid on the domain of `pre_bounds` (CROWN)."""
    offset = spec @ net.biases[layer]
    if spec.stride(0) == 0:  # the same spec in every row: multiply once
        coeffs = (spec[:1] @ net.weights[layer]).expand(spec.shape[0], -1, -1)
    else:
        coeffs = spec @ net.weights[layer]
    for t in range(layer - 1, -1, -1):
        su, tu, sl = relu_relaxation(*pre_bounds[t])
        offset = offset + (coeffs.clamp(min=0) @ tu[:, :, None]).squeeze(-1)
        coeffs = coeffs * torch.where(coeffs > 0, su[:, None, :], sl[:, None, :])
        offset = offset + coeffs @ net.biases[t]
        coeffs = coeffs @ net.weights[t]
    return coeffs, offset


def interval_affine(weight: torch.Tensor, bias: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    mid, rad = (hi + lo) / 2, (hi - lo) / 2
    centre = mid @ weight.T + bias
    radius = rad @ weight.abs().T
    return centre - radius, centre + radius


@dataclass
class Bounds:
    """Upper bounds of spec.f(x) over each domain row. `coeffs`/`offset`: CROWN's linear upper bound
    spec.f(x) <= coeffs.x + offset (None for IBP); `pre_bounds`: (lo, hi) of every hidden pre-activation."""

    upper: torch.Tensor  # (B, S)
    ibp_upper: torch.Tensor  # (B, S)
    coeffs: torch.Tensor | None
    offset: torch.Tensor | None
    pre_bounds: list


def spec_bounds(net: AffineNet, domain: Domain, spec: torch.Tensor, method: str = "crown") -> Bounds:
    """Bounds of spec.f(x) (spec: (S, K) or (B, S, K)) over every domain row, by IBP or CROWN.

    Intermediate bounds are CROWN intersected with IBP (both sound); the first layer is exact on the domain."""
    if method not in ("crown", "ibp"):
        raise ValueError(f"unknown bound method {method}")
    batch, depth = domain.batch, len(net.weights)
    spec = spec.double().expand(batch, *spec.shape[-2:])
    first = net.weights[0].expand(batch, -1, -1)
    pre = [concretize_bounds(domain, first, net.biases[0].expand(batch, -1))] if depth > 1 else []
    for layer in range(1, depth - 1):
        lo, hi = interval_affine(net.weights[layer], net.biases[layer], pre[-1][0].clamp(min=0), pre[-1][1].clamp(min=0))
        unstable = ((lo < 0) & (hi > 0)).any(0).nonzero().flatten()
        if method == "crown" and len(unstable):  # stable neurons relax exactly: only unstable ones need CROWN
            rows = torch.eye(len(lo[0]), dtype=torch.float64)[unstable]
            coeffs, offset = backward_linear(net, torch.cat([rows, -rows]).expand(batch, -1, -1), layer, pre)
            upper = concretize_upper(domain, coeffs, offset)
            count = len(unstable)
            lo[:, unstable] = torch.maximum(lo[:, unstable], -upper[:, count:])
            hi[:, unstable] = torch.minimum(hi[:, unstable], upper[:, :count])
        pre.append((lo, hi))
    last_w, last_b = net.weights[-1], net.biases[-1]
    if depth == 1:
        coeffs, offset = spec @ last_w, spec @ last_b
        exact = concretize_upper(domain, coeffs, offset)
        return Bounds(exact, exact, coeffs, offset, pre)
    post_lo, post_hi = pre[-1][0].clamp(min=0), pre[-1][1].clamp(min=0)
    spec_w, spec_b = spec @ last_w, spec @ last_b  # (B, S, h), (B, S)
    ibp_upper = (spec_w.clamp(min=0) * post_hi[:, None, :] + spec_w.clamp(max=0) * post_lo[:, None, :]).sum(-1) + spec_b
    if method == "ibp":
        return Bounds(ibp_upper, ibp_upper, None, None, pre)
    coeffs, offset = backward_linear(net, spec, depth - 1, pre)
    return Bounds(concretize_upper(domain, coeffs, offset), ibp_upper, coeffs, offset, pre)


def margin_spec(n_classes: int, label: int) -> torch.Tensor:
    """Rows e_i - e_c for every i != c: f_i - f_c <= 0 for all rows means the label c cannot be overtaken."""
    others = [i for i in range(n_classes) if i != label]
    spec = torch.zeros(len(others), n_classes, dtype=torch.float64)
    spec[torch.arange(len(others)), others] = 1.0
    spec[:, label] = -1.0
    return spec


def certified(net: AffineNet, domain: Domain, label: int, method: str = "crown") -> torch.Tensor:
    """(B,) bool: the label provably stays the strict argmax over each domain row."""
    return spec_bounds(net, domain, margin_spec(net.n_classes, label), method).upper.amax(-1) < 0
