"""EAMET: robust massive model editing via embedding alignment (Dai, Ji, Li, Wang; arXiv 2505.11876).

Paper: https://arxiv.org/abs/2505.11876 · official code: https://github.com/ybdai7/EAMET-massive-editing

EAMET is MEMIT with one change in the value optimisation: requests are optimised in order, and δ_i is pulled
towards the similarity structure of the keys. With S_k(i, j) = cos(k_i, k_j) (z-layer keys) and
S_r(i, j) = cos(δ_i, δ_j) over earlier requests j < i (frozen):
  L_KL  = KL(P_k ‖ P_r), P_k = softmax_j(S_k/τ), P_r = softmax_j(S_r/τ)            (direction as coded)
  L_MSE = Σ_{j ∈ top-M by S_k} softmax(S_k/τ)_j · (S_k(i, j) − S_r(i, j))²
  L_i   = NLL + kl_factor·KL(essence) + cs_factor·L_KL + mse_factor·L_MSE,
with δ started at ‖k_i‖·h_i/‖h_i‖ (when ‖h_i‖ < 100) and projected onto ‖δ_i‖ ≤ clamp_ks_factor·‖k_i‖.
Order, as the official compute_z: requests are optimised one at a time, and request i's neighbours are the final,
frozen δ of the requests before it (rows whose final δ is 0 have no direction and are no neighbours); a request
with no such neighbour gets no alignment term. Requests of earlier sequential batches (batch_size) stay
neighbours here; the official code starts each batch afresh.

This module is EAMET's math: the alignment that plugs into MEMIT's value optimisation (values.ValueAlignment).
The method itself (MEMIT with this alignment) is registered in toolkit/edit/methods/eamet.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from toolkit.edit.config import EametConfig  # noqa: F401 - EAMET's knobs, beside its math


def masked_log_softmax(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """log softmax over the valid entries of each row; invalid entries get -inf (rows without any stay finite 0)."""
    masked = scores.masked_fill(~valid, float("-inf"))
    out = torch.log_softmax(masked, dim=-1)
    return torch.where(valid, out, torch.zeros_like(out))


def alignment_losses(key_sim: torch.Tensor, delta_sim: torch.Tensor, valid: torch.Tensor, tau: float,
                     top_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (KL(P_k ‖ P_r), weighted MSE over the top-M key neighbours); rows with no valid j give 0."""
    log_pk = masked_log_softmax(key_sim / tau, valid)
    log_pr = masked_log_softmax(delta_sim / tau, valid)
    pk = torch.where(valid, log_pk.exp(), torch.zeros_like(log_pk))
    kl = (pk * (log_pk - log_pr)).sum(-1)
    m = min(top_m, key_sim.shape[-1])
    ranked = key_sim.masked_fill(~valid, float("-inf"))
    top = ranked.topk(m, dim=-1).indices
    top_valid = valid.gather(-1, top)
    top_key, top_delta = key_sim.gather(-1, top), delta_sim.gather(-1, top)
    weights = masked_log_softmax(top_key / tau, top_valid).exp() * top_valid
    mse = (weights * (top_key - top_delta).square()).sum(-1)
    return kl, mse


class EmbeddingAlignment:
    """Holds the keys and final δ of all requests so far; gives each chunk its alignment loss (a
    values.ValueAlignment)."""

    sequential = True  # request i is aligned with the final δ of every j < i: one request at a time

    def __init__(self, config: EametConfig):
        self.config = config
        self.keys = torch.empty(0)  # unit keys of every request seen, (n_seen, d_k)
        self.deltas = torch.empty(0)  # unit final δ of every finished request, (n_done, d)
        self.offset = 0  # global index of the current batch's first request

    def begin_batch(self, keys_z: torch.Tensor) -> None:
        unit = F.normalize(keys_z.float(), dim=-1)
        self.offset = self.keys.shape[0]
        self.keys = unit if self.offset == 0 else torch.cat([self.keys.to(unit.device), unit])

    def loss(self, delta: torch.Tensor, span: range) -> torch.Tensor:
        """Alignment loss of the requests in `span` (numbered within the batch) against the requests finished
        before span.start: only their final δ, never a δ still being optimised (optimise_values passes one
        request at a time, so this is request i against every j < i)."""
        first = self.offset + span.start  # requests before it are final
        chunk_keys = self.keys[first:first + len(span)]
        # δ = 0 (the zero start, and the target start when ‖h‖ ≥ 100) has no direction: cos(δ, ·) there has a
        # gradient of 1/eps ≈ 1e12, which swamps the NLL and, through Adam's second moment, freezes δ for good.
        # Such rows get no alignment term until the NLL has moved them.
        live = delta.detach().norm(dim=-1) > 1e-6
        unit = F.normalize(torch.where(live[:, None], delta, torch.ones_like(delta)), dim=-1) * live[:, None]
        done = self.deltas[:first].to(delta.device) if first else unit.new_zeros(0, delta.shape[-1])
        key_sim = chunk_keys.to(delta.device) @ self.keys[:first].to(delta.device).t()
        delta_sim = unit @ done.t()
        # a finished request whose final δ is 0 (it never moved) is no neighbour
        valid = (done.norm(dim=-1) > 0.5)[None, :].expand(len(span), -1)
        kl, mse = alignment_losses(key_sim, delta_sim, valid, self.config.tau, self.config.top_m)
        return (self.config.cs_factor * kl + self.config.mse_factor * mse) * live

    def record(self, delta: torch.Tensor, span: range) -> None:
        """Freeze the final δ of the requests in `span`; a δ still 0 is kept as a zero row (no neighbour)."""
        delta = delta.detach().float()
        unit = F.normalize(delta, dim=-1) * (delta.norm(dim=-1, keepdim=True) > 1e-6)
        self.deltas = unit if self.deltas.numel() == 0 else torch.cat([self.deltas.to(unit.device), unit])

