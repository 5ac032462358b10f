"""VeriX-style sequential explanations: the baseline FAME is compared against.

VeriX (Wu, Wu, Barrett, NeurIPS 2023; https://github.com/NeuralNetworkVerification/VeriX) frees pixels one at a
time in a traversal order, keeping a pixel whenever the verifier cannot prove the label with it freed.
VERIX+ (arXiv 2409.03060; https://github.com/minwu-cs/verix_plus) orders pixels by a bound of their individual
effect. Here the verifier is pluggable: the same CROWN oracle as FAME, or the exact MILP (a true subset-minimal
explanation, the ground truth FAME's distance to minimality is about).
"""

from __future__ import annotations

import torch

from toolkit.explain.config import VerixConfig
from toolkit.explain.crown import box_domains, margin_spec, spec_bounds
from toolkit.explain.exact import exact_check
from toolkit.explain.net import AffineNet


def traversal_order(net: AffineNet, x0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, label: int,
                    order: str) -> torch.Tensor:
    """Pixels, least influential first."""
    n = net.n_features
    if order == "sensitivity":
        flipped = x0.expand(n, -1).clone()
        moving = torch.arange(n)[:, None] == net.feature_of_input()[None, :]
        flipped[moving] = (1 - flipped)[moving]
        drop = net(x0)[label] - net(flipped)[:, label]
        return drop.argsort()
    singles = box_domains(net, x0, lower, upper, torch.eye(n, dtype=torch.bool))
    worst = spec_bounds(net, singles, margin_spec(net.n_classes, label), "crown").upper.amax(-1)
    return worst.argsort()


def oracle_says_free(net: AffineNet, x0, lower, upper, free: torch.Tensor, label: int, oracle: str,
                     time_limit: float) -> bool:
    """True when the oracle proves the label on the box where `free` moves (unknown counts as no)."""
    if oracle == "exact":
        return exact_check(net, x0, lower, upper, free, label, time_limit).robust is True
    bounds = spec_bounds(net, box_domains(net, x0, lower, upper, free[None]), margin_spec(net.n_classes, label),
                         oracle)
    return bool(bounds.upper.amax() < 0)


def sequential_free(net: AffineNet, x0, lower, upper, free: torch.Tensor, label: int, pixels, oracle: str,
                    time_limit: float = 30.0) -> torch.Tensor:
    """Try the pixels in order, freeing each one the oracle accepts on top of the current free set."""
    free = free.clone()
    for pixel in pixels:
        trial = free.clone()
        trial[int(pixel)] = True
        if oracle_says_free(net, x0, lower, upper, trial, label, oracle, time_limit):
            free = trial
    return free


def verix_explain(net: AffineNet, x0, lower, upper, label: int, order: str = "bounds", oracle: str = "crown",
                  time_limit: float = 30.0) -> torch.Tensor:
    """The VeriX-style explanation: returns the freed pixels (P,) bool."""
    pixels = traversal_order(net, x0, lower, upper, label, order)
    empty = torch.zeros(net.n_features, dtype=torch.bool)
    return sequential_free(net, x0, lower, upper, empty, label, pixels, oracle, time_limit)


def run(config: VerixConfig, ctx) -> dict:
    from toolkit.explain.formal_runs import explain_images

    def explain(net, sample):
        return verix_explain(net, sample.x0, sample.lower, sample.upper, sample.label, config.order, config.oracle,
                             config.exact_time_limit), {}

    return explain_images(config, ctx, f"verix-{config.oracle}", explain)
