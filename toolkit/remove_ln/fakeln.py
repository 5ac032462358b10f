"""FakeLN: a LayerNorm whose per-token std can be swapped for a frozen average std σ_avg, making it affine.

`FakeLN(x) = (x − mean_d(x)) / σ · γ + β` where σ is the token's own std while the LN is real, and the EMA
σ_avg (momentum 0.9, official `train.py: FakeLayerNorm`) once it is switched off. End-of-text tokens and position 0
(attention sinks with large residual norms) keep their own average σ_special until the later EOT/BOS stages.
GPT-2's ln_1 is split into a Q/K path and a V path that are switched off at different steps; both share γ, β.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from toolkit.core.errors import BadInputError
from toolkit.remove_ln.config import SigmaMode

SUPPORTED = ("gpt2",)


class SpecialTokens(nn.Module):
    """Which tokens keep their own std: EOT tokens (until the EOT stage) and position 0 (until the BOS stage).

    The stage flags are buffers so checkpoints carry them; the masks are set from input_ids before each forward."""

    def __init__(self, eot_id: int | None):
        super().__init__()
        self.eot_id = eot_id
        self.register_buffer("keep_eot", torch.tensor(True))
        self.register_buffer("keep_bos", torch.tensor(True))
        self.is_special: torch.Tensor | None = None  # (B, T, 1): EOT or position 0
        self.kept: torch.Tensor | None = None  # (B, T, 1): special and its stage not yet reached

    def observe(self, input_ids: torch.Tensor) -> None:
        eot = (input_ids == self.eot_id) if self.eot_id is not None else torch.zeros_like(input_ids, dtype=torch.bool)
        bos = torch.zeros_like(eot)
        bos[:, 0] = True
        self.is_special = (eot | bos).unsqueeze(-1)
        self.kept = ((eot & self.keep_eot) | (bos & self.keep_bos)).unsqueeze(-1)


class FakeLayerNorm(nn.Module):
    """One LayerNorm position (ln_2, ln_1-QK, ln_1-V or ln_f). γ and β are the original LN's Parameters."""

    def __init__(self, norm: nn.LayerNorm, specials: SpecialTokens, name: str, momentum: float = 0.9,
                 sigma_mode: SigmaMode = "recompute_on_real"):
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps
        self.specials = [specials]  # a list so the shared module is not registered once per FakeLN
        self.name, self.momentum, self.sigma_mode = name, momentum, sigma_mode
        self.register_buffer("sigma_avg", torch.tensor(1.0))
        self.register_buffer("sigma_special", torch.tensor(1.0))
        self.register_buffer("fake", torch.tensor(False))
        self.measuring: list[tuple[float, float]] | None = None

    def token_std(self, centered: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(centered.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(-1, keepdim=True)
        std = self.token_std(centered)
        self._track(std.detach())
        if bool(self.fake):
            kept = self.specials[0].kept
            std = self.sigma_avg.expand_as(std) if kept is None else torch.where(kept, self.sigma_special,
                                                                                  self.sigma_avg)
        return centered / std * self.weight + self.bias

    @torch.no_grad()
    def _track(self, std: torch.Tensor) -> None:
        special = self.specials[0].is_special
        special = torch.zeros_like(std, dtype=torch.bool) if special is None else special.expand_as(std)
        regular_mean = std[~special].float().mean() if (~special).any() else None
        special_mean = std[special].float().mean() if special.any() else None
        if self.measuring is not None:
            self.measuring.append((float("nan") if regular_mean is None else regular_mean.item(),
                                   float("nan") if special_mean is None else special_mean.item()))
            return
        tracking = self.sigma_mode == "recompute_on_fake" or (self.sigma_mode == "recompute_on_real"
                                                              and not bool(self.fake))
        if not (self.training and tracking):
            return
        m = self.momentum
        if regular_mean is not None:
            self.sigma_avg.mul_(m).add_((1 - m) * regular_mean.to(self.sigma_avg.dtype))
        if special_mean is not None:
            self.sigma_special.mul_(m).add_((1 - m) * special_mean.to(self.sigma_special.dtype))


class SplitQKVInput(nn.Module):
    """Replaces GPT-2's `attn.c_attn` (with ln_1 set to identity): Q/K read the QK-path FakeLN, V the V-path one."""

    def __init__(self, c_attn: nn.Module, qk: FakeLayerNorm, v: FakeLayerNorm):
        super().__init__()
        self.c_attn, self.qk, self.v = c_attn, qk, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = self.c_attn.weight.shape[1] // 3
        weight, bias = self.c_attn.weight, self.c_attn.bias
        qk = self.qk(x) @ weight[:, :2 * width] + bias[:2 * width]
        v = self.v(x) @ weight[:, 2 * width:] + bias[2 * width:]
        return torch.cat([qk, v], dim=-1)


@dataclass
class FakeLNModel:
    """Handles to the FakeLNs of a converted model, in schedule order per kind."""

    model: nn.Module
    specials: SpecialTokens
    ln2: list[FakeLayerNorm] = field(default_factory=list)
    ln1_qk: list[FakeLayerNorm] = field(default_factory=list)
    ln1_v: list[FakeLayerNorm] = field(default_factory=list)
    ln_f: FakeLayerNorm | None = None

    def all(self) -> list[FakeLayerNorm]:
        return [*self.ln2, *self.ln1_qk, *self.ln1_v, self.ln_f]

    def fully_removed(self) -> bool:
        return all(bool(f.fake) for f in self.all()) and not bool(self.specials.keep_eot) \
            and not bool(self.specials.keep_bos)

    def sigmas(self) -> dict[str, float]:
        return {f.name: float(f.sigma_avg) for f in self.all()}


def check_supported(model: nn.Module) -> None:
    """GPT-2 only; RMSNorm models have no mean/bias to remove, others have no QK/V split here."""
    model_type = getattr(model.config, "model_type", None)
    if model_type in SUPPORTED:
        if getattr(model.config, "add_cross_attention", False):
            raise BadInputError("remove-ln does not support GPT-2 with cross-attention")
        return
    if any(type(m).__name__.endswith("RMSNorm") for m in model.modules()):
        raise BadInputError(f"model_type '{model_type}' uses RMSNorm, not LayerNorm: remove-ln removes LayerNorm",
                            "RMSNorm removal is not part of this paper; use a GPT-2 model")
    if not any(isinstance(m, nn.LayerNorm) for m in model.modules()):
        raise BadInputError(f"model_type '{model_type}' has no LayerNorm modules to remove")
    raise BadInputError(f"remove-ln supports GPT-2 only, got model_type '{model_type}'",
                        "GPT-NeoX/Pythia (parallel attention+MLP) and OPT are not supported yet")


def convert(model: nn.Module, eot_id: int | None, momentum: float = 0.9,
            sigma_mode: SigmaMode = "recompute_on_real") -> FakeLNModel:
    """Swap every LayerNorm of a GPT-2 LM in place for FakeLNs (all still real) and hook the special-token masks."""
    check_supported(model)
    specials = SpecialTokens(eot_id)
    model.add_module("remove_ln_specials", specials)
    handle = FakeLNModel(model=model, specials=specials)
    make = lambda norm, name: FakeLayerNorm(norm, specials, name, momentum, sigma_mode)
    for index, block in enumerate(model.transformer.h):
        handle.ln2.append(make(block.ln_2, f"blocks.{index}.ln_2"))
        handle.ln1_qk.append(make(block.ln_1, f"blocks.{index}.ln_1_qk"))
        handle.ln1_v.append(make(block.ln_1, f"blocks.{index}.ln_1_v"))
        block.attn.c_attn = SplitQKVInput(block.attn.c_attn, handle.ln1_qk[-1], handle.ln1_v[-1])
        block.ln_1 = nn.Identity()
        block.ln_2 = handle.ln2[-1]
    handle.ln_f = make(model.transformer.ln_f, "ln_f")
    model.transformer.ln_f = handle.ln_f
    model.register_forward_pre_hook(_observe_ids(specials), with_kwargs=True)
    return handle


def _observe_ids(specials: SpecialTokens):
    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise BadInputError("FakeLN models need input_ids (not inputs_embeds) to find EOT/position-0 tokens")
        specials.observe(ids)
    return hook


@torch.no_grad()
def measure_sigmas(handle: FakeLNModel, batches) -> None:
    """Initial σ_avg/σ_special = mean token std at each LN input on the original model (the official std dicts)."""
    fakes = handle.all()
    for fake in fakes:
        fake.measuring = []
    was_training = handle.model.training
    handle.model.eval()
    try:
        for batch in batches:
            handle.model(input_ids=batch)
    finally:
        handle.model.train(was_training)
    for fake in fakes:
        regular = torch.tensor([r for r, _ in fake.measuring]).nanmean()
        special = torch.tensor([s for _, s in fake.measuring]).nanmean()
        fake.sigma_avg.fill_(regular.item())
        fake.sigma_special.fill_(special.item() if torch.isfinite(special) else regular.item())
        fake.measuring = None


def remove_all(handle: FakeLNModel) -> None:
    """Switch every LN off at once (the naive, no-fine-tuning removal)."""
    for fake in handle.all():
        fake.fake.fill_(True)
    handle.specials.keep_eot.fill_(False)
    handle.specials.keep_bos.fill_(False)
