"""The weight VAE: a transformer encoder/decoder over windows of weight tokens, trained in two stages.

Stage 1 ("high capacity"): one latent vector per token (no compression), loss = Huber reconstruction + MMD to the
prior + a small KL, as in the official `AutoencoderKL` (sorobedio/ls-merge, vit_vae/models/autoencoder.py).
Stage 2 ("compact code", not released; our reading of the paper): the stage-1 encoder is frozen, a neck maps the
window's T latent tokens to T/r tokens and back (the official `tok` pooling idea), and the neck + decoder are trained
with the reconstruction loss plus an L2 distillation loss towards the stage-1 posterior means (and the
reconstruction from the stage-1 code, since the decoder is shared by both codes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from toolkit.merge.chunking import TYPE_IDS


@dataclass
class VAEShape:
    chunk: int = 64
    window: int = 16
    d_model: int = 128
    heads: int = 4
    encoder_layers: int = 2
    decoder_layers: int = 2
    latent_dim: int = 64
    compression: int = 4
    max_layers: int = 64

    def as_dict(self) -> dict:
        return asdict(self)


def sinusoid(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sin-cos features of integer positions (no maximum, unlike a learned table)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32) / half)
    angles = positions.float().unsqueeze(-1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _blocks(shape: VAEShape, n: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(shape.d_model, shape.heads, 4 * shape.d_model, dropout=0.0,
                                       batch_first=True, norm_first=True, activation="gelu")
    return nn.TransformerEncoder(layer, n, enable_nested_tensor=False)


class WeightVAE(nn.Module):
    def __init__(self, shape: VAEShape):
        super().__init__()
        if shape.window % shape.compression:
            raise ValueError("window must be a multiple of compression")
        self.shape = shape
        d, t = shape.d_model, shape.window
        self.embed = nn.Linear(shape.chunk, d)
        self.layer_embed = nn.Embedding(shape.max_layers, d)
        self.type_embed = nn.Embedding(len(TYPE_IDS), d)
        self.slot_embed = nn.Embedding(t, d)
        self.encoder = _blocks(shape, shape.encoder_layers)
        self.encoder_norm = nn.LayerNorm(d)
        self.to_mu = nn.Linear(d, shape.latent_dim)
        self.to_logvar = nn.Linear(d, shape.latent_dim)
        self.neck_mu = nn.Linear(t, t // shape.compression)
        self.neck_logvar = nn.Linear(t, t // shape.compression)
        self.neck_up = nn.Linear(t // shape.compression, t)
        self.from_latent = nn.Linear(shape.latent_dim, d)
        self.decoder = _blocks(shape, shape.decoder_layers)
        self.decoder_norm = nn.LayerNorm(d)
        self.to_weights = nn.Linear(d, shape.chunk)

    def condition(self, batch: dict) -> torch.Tensor:
        """Where each token sits: its layer, tensor type, position in the tensor and slot in the window."""
        slots = torch.arange(self.shape.window, device=batch["x"].device)
        return (self.layer_embed(batch["layer"]) + self.type_embed(batch["type"]) + self.slot_embed(slots)
                + sinusoid(batch["pos"], self.shape.d_model).to(batch["x"].device))

    def encode_full(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage-1 posterior: per-token mean and log-variance (B, T, latent)."""
        h = self.embed(batch["x"] * batch["valid"]) + self.condition(batch)
        h = self.encoder_norm(self.encoder(h, src_key_padding_mask=~batch["token_mask"]))
        return self.to_mu(h), self.to_logvar(h).clamp(-10.0, 10.0)

    def compact(self, mu_full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage-2 posterior: T latent tokens -> T/r tokens (mixing along the token axis)."""
        along_tokens = mu_full.transpose(1, 2)
        return (self.neck_mu(along_tokens).transpose(1, 2),
                self.neck_logvar(along_tokens).transpose(1, 2).clamp(-10.0, 10.0))

    def expand(self, z_compact: torch.Tensor) -> torch.Tensor:
        return self.neck_up(z_compact.transpose(1, 2)).transpose(1, 2)

    def decode(self, z_full: torch.Tensor, batch: dict) -> torch.Tensor:
        h = self.from_latent(z_full) + self.condition(batch)
        h = self.decoder_norm(self.decoder(h, src_key_padding_mask=~batch["token_mask"]))
        return self.to_weights(h)

    def encode(self, batch: dict, stage: int) -> torch.Tensor:
        """Posterior means used for merging: the full code (stage 1) or the compact code (stage 2)."""
        mu, _ = self.encode_full(batch)
        return mu if stage == 1 else self.compact(mu)[0]

    def decode_code(self, code: torch.Tensor, batch: dict, stage: int) -> torch.Tensor:
        return self.decode(code if stage == 1 else self.expand(code), batch)


def masked_huber(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    loss = nn.functional.huber_loss(pred, target, reduction="none", delta=delta)
    return (loss * valid).sum() / valid.sum().clamp(min=1)


def gaussian_mmd(samples: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """Biased MMD² with a Gaussian kernel of bandwidth 1 per latent dimension."""
    dim = samples.shape[-1]

    def kernel(a, b):
        return torch.exp(-torch.cdist(a, b).pow(2) / (2.0 * dim))

    return kernel(samples, samples).mean() + kernel(prior, prior).mean() - 2 * kernel(samples, prior).mean()


def kl_to_standard(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    return 0.5 * (mu.pow(2) + logvar.exp() - 1.0 - logvar).mean()


@dataclass
class LossWeights:
    """Official defaults: 1000·Huber + 0.1·100·MMD + 1e-4·KL; stage 2 adds the distillation term."""

    recon: float = 1000.0
    mmd: float = 10.0
    kl: float = 1e-4
    distill: float = 100.0


def _tokens_of(z: torch.Tensor, token_mask: torch.Tensor | None, limit: int = 256) -> torch.Tensor:
    flat = z[token_mask] if token_mask is not None else z.reshape(-1, z.shape[-1])
    return flat[:limit]


def stage_loss(model: WeightVAE, batch: dict, stage: int, weights: LossWeights) -> tuple[torch.Tensor, dict]:
    """One training loss; returns (loss, parts) with the parts as floats for logging."""
    if stage == 1:
        mu, logvar = model.encode_full(batch)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        recon = model.decode(z, batch)
        latent_tokens = _tokens_of(z, batch["token_mask"])
        distill = torch.zeros((), device=mu.device)
    else:
        with torch.no_grad():
            teacher, _ = model.encode_full(batch)
        mu, logvar = model.compact(teacher)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        recon = model.decode(model.expand(z), batch)
        latent_tokens = _tokens_of(z, None)
        distill = ((model.expand(mu) - teacher).pow(2).mean(-1) * batch["token_mask"]).sum() / batch["token_mask"].sum()
        # the decoder is shared: keep decoding the full stage-1 code too, so `code=full` merges stay usable
        full_path = masked_huber(model.decode(teacher, batch), batch["x"], batch["valid"])
    parts = {"huber": masked_huber(recon, batch["x"], batch["valid"]) + (full_path if stage == 2 else 0.0),
             "mmd": gaussian_mmd(latent_tokens, torch.randn_like(latent_tokens)),
             "kl": kl_to_standard(mu, logvar), "distill": distill}
    loss = (weights.recon * parts["huber"] + weights.mmd * parts["mmd"] + weights.kl * parts["kl"]
            + weights.distill * parts["distill"])
    return loss, {k: float(v.detach()) for k, v in parts.items()}


def stage_parameters(model: WeightVAE, stage: int) -> list[nn.Parameter]:
    """Stage 1 trains everything but the neck; stage 2 freezes the encoder (and the position embeddings it shares
    with the decoder, so the teacher stays fixed) and trains neck + decoder."""
    neck = {id(p) for m in (model.neck_mu, model.neck_logvar, model.neck_up) for p in m.parameters()}
    encoder = {id(p) for m in (model.embed, model.encoder, model.encoder_norm, model.to_mu, model.to_logvar,
                               model.layer_embed, model.type_embed, model.slot_embed) for p in m.parameters()}
    if stage == 1:
        return [p for p in model.parameters() if id(p) not in neck]
    return [p for p in model.parameters() if id(p) not in encoder]
