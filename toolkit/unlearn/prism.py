"""PRISM: dual-space smoothness for robust, balanced LLM unlearning (Yan, Liu, Jiang).

Paper: https://arxiv.org/abs/2509.23362 (OpenReview VIMW3eys6x). Official code: https://github.com/Tsuzukii/PRISM.

Stage 1 trains a probe on layer-ℓ representations (forget = 1, retain = 0) with FGSM perturbations of those
representations. Stage 2 unlearns with L_f = NPO + γ(p)·CE(probe(h_ℓ(x_f)), retain-class), takes the forget gradient
at the SAM point θ + ρ·g/‖g‖, removes from it (per parameter tensor) its component along the retain gradient, and
steps AdamW on npo_coeff·g_f + coeff·g_r. Unlike the official code the probe term is really active (γ is computed
in the step), SAM and the probe run for every PRISM launch, the probe sees the same mean-pooled features it was
trained on, and NPO uses sequence log-likelihood ratios (technique note pitfalls 1-4).
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field

from toolkit.core.errors import BadInputError
from toolkit.models.source import load_model
from toolkit.unlearn.losses import (
    decouple,
    fgsm_probe_loss,
    mean_nll,
    npo_loss,
    probe_weight,
    sam_perturbation,
    sequence_logprob,
)
from toolkit.unlearn.train import (
    Corpus,
    StepInputs,
    UnlearnConfig,
    hidden_states,
    load_corpus,
    mean_pool,
    sequence_logprobs,
    train,
)

PAPER = "https://arxiv.org/abs/2509.23362"


class PrismConfig(UnlearnConfig):
    """PRISM knobs; defaults are the official MUSE-News script values (WMDP: rho 0.008, gamma 0.05, layer 28)."""

    beta: float = Field(0.1, gt=0, description="NPO inverse temperature β.")
    sam_rho: float = Field(0.011, ge=0, description="SAM radius ρ on the forget loss (0 disables SAM).")
    adv_gamma: float = Field(0.085, ge=0, description="γ_max of the annealed probe term (0 disables it).")
    project: bool = Field(True, description="Project the forget gradient orthogonal to the retain gradient.")
    coeff: float = Field(1.0, ge=0, description="Weight of the retain gradient.")
    npo_coeff: float = Field(1.0, ge=0, description="Weight of the (projected) forget gradient.")
    probe_layer: Optional[int] = Field(None, ge=0, description="Hidden-state index ℓ (0 = embeddings); "
                                       "default: 3/4 of the depth (News script: 24 of 32).")
    probe_hidden: tuple[int, ...] = Field((64, 32), description="Probe MLP widths (empty = linear probe).")
    probe_epsilon: float = Field(1e-2, ge=0, description="FGSM step ε on the representations.")
    probe_alpha: float = Field(0.4, ge=0, description="Weight α of the adversarial CE term.")
    probe_l1: float = Field(1e-4, ge=0, description="L1 penalty λ₁ on the probe weights.")
    probe_lr: float = Field(1e-4, gt=0, description="Probe Adam learning rate.")
    probe_epochs: int = Field(10, ge=1, description="Probe training epochs.")
    probe_batch_size: int = Field(16, ge=1, description="Probe batch size (MUSE 16, WMDP 256).")
    probe_val_fraction: float = Field(0.2, ge=0, lt=1, description="Share of windows held out to score the probe.")


def make_probe(width: int, hidden: tuple[int, ...]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for size in hidden:
        layers += [torch.nn.Linear(width, size), torch.nn.ReLU()]
        width = size
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 2))


@torch.no_grad()
def pooled_features(model, corpus: Corpus, chunks: list[torch.Tensor], layer: int, device,
                    batch_size: int = 8) -> torch.Tensor:
    from toolkit.unlearn.data import collate

    feats = []
    for start in range(0, len(chunks), batch_size):
        batch = {k: v.to(device) for k, v in collate(chunks[start:start + batch_size], corpus.pad).items()}
        feats.append(mean_pool(hidden_states(model, batch, layer)[1], batch["attention_mask"]).float().cpu())
    return torch.cat(feats)


def train_probe(features: torch.Tensor, labels: torch.Tensor, config: PrismConfig, seed: int) -> tuple:
    """Stage 1: FGSM-robust probe; returns (probe, train accuracy, held-out accuracy or None)."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=generator)
    n_val = int(round(config.probe_val_fraction * len(labels)))
    val, fit = order[:n_val], order[n_val:]
    torch.manual_seed(seed)
    probe = make_probe(features.shape[1], config.probe_hidden)
    optimizer = torch.optim.Adam(probe.parameters(), lr=config.probe_lr)
    for _ in range(config.probe_epochs):
        for batch in fit[torch.randperm(len(fit), generator=generator)].split(config.probe_batch_size):
            optimizer.zero_grad()
            fgsm_probe_loss(probe, features[batch], labels[batch], config.probe_epsilon, config.probe_alpha,
                            config.probe_l1).backward()
            optimizer.step()
    probe.eval().requires_grad_(False)

    def accuracy(index):
        return float((probe(features[index]).argmax(-1) == labels[index]).float().mean()) if len(index) else None

    return probe, accuracy(fit), accuracy(val)


def forget_loss(model, batch: dict, ref_logp: torch.Tensor, beta: float, probe, layer: int,
                gamma: float) -> tuple[torch.Tensor, dict]:
    """L_f = NPO + γ·CE(probe(mean-pooled h_ℓ(x_f)), 0): the probe term pulls forget representations to 'retain'."""
    logits, hidden = hidden_states(model, batch, layer)
    npo = npo_loss(sequence_logprob(logits, batch["input_ids"], batch["attention_mask"]), ref_logp, beta)
    feats = mean_pool(hidden, batch["attention_mask"]).float()
    target = torch.zeros(len(feats), dtype=torch.long, device=feats.device)
    probe_ce = F.cross_entropy(probe(feats), target)
    return npo + gamma * probe_ce, {"npo": npo.item(), "probe_ce": probe_ce.item(), "gamma": gamma}


def _grads(params) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.detach().clone() for p in params]


def prism_objective(config: PrismConfig, ref_logp: torch.Tensor, probe, layer: int):
    """One PRISM step: leaves npo_coeff·g_f(SAM, projected) + coeff·g_r in p.grad."""
    def step(s: StepInputs) -> dict:
        gamma = probe_weight(config.adv_gamma, s.epoch, s.epochs)
        ref = ref_logp[s.forget_index].to(s.forget["input_ids"].device)
        params = s.params
        if config.sam_rho > 0:
            loss, _ = forget_loss(s.model, s.forget, ref, config.beta, probe, layer, gamma)
            s.backward(loss)
            origin = [p.detach().clone() for p in params]
            _shift(params, sam_perturbation(_grads(params), config.sam_rho))
            _zero(params)
        loss, logs = forget_loss(s.model, s.forget, ref, config.beta, probe, layer, gamma)
        s.backward(loss)
        g_forget = _grads(params)
        if config.sam_rho > 0:
            _restore(params, origin)  # exactly θ again (θ + ε − ε is not, in floating point)
        _zero(params)
        retain = mean_nll(s.model(**s.retain).logits, s.retain["input_ids"], s.retain["attention_mask"])
        s.backward(retain)
        g_retain = _grads(params)
        if config.project:
            g_forget = decouple(g_forget, g_retain)
        for p, gf, gr in zip(params, g_forget, g_retain):
            parts = [c * g for c, g in ((config.npo_coeff, gf), (config.coeff, gr)) if g is not None]
            p.grad = sum(parts) if parts else None
        return {**logs, "forget_loss": loss.item(), "retain_nll": retain.item()}
    return step


@torch.no_grad()
def _shift(params, delta) -> None:
    for p, d in zip(params, delta):
        if d is not None:
            p.add_(d)


@torch.no_grad()
def _restore(params, origin) -> None:
    for p, o in zip(params, origin):
        p.copy_(o)


def _zero(params) -> None:
    for p in params:
        p.grad = None


def default_layer(model) -> int:
    return max(1, round(0.75 * model.config.num_hidden_layers))


def plan(config: PrismConfig, ctx) -> dict:
    return {"stages": ["probe (FGSM-robust, mean-pooled h_l)", "NPO + annealed probe term, SAM, projection"],
            "probe_layer": config.probe_layer or "3/4 depth", "epochs": config.epochs, "max_steps": config.max_steps}


def run_prism(config: PrismConfig, ctx) -> None:
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    corpus = load_corpus(config, tokenizer, need_retain=True)
    layer = config.probe_layer if config.probe_layer is not None else default_layer(model)
    if layer > model.config.num_hidden_layers:
        raise BadInputError(f"probe_layer {layer} > {model.config.num_hidden_layers} layers")
    clock = time.perf_counter()
    probe, layer, probe_stats = _stage_probe(config, ctx, model, corpus, layer)
    ref_logp = sequence_logprobs(model, corpus, corpus.forget, ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    result = train(config, ctx, model, corpus, prism_objective(config, ref_logp, probe, layer), params, "prism")
    finish(ctx, config, tokenizer, result, "unlearn.prism",
           {**probe_stats, "probe_layer": layer, "forget_windows": len(corpus.forget),
            "retain_windows": len(corpus.retain), "seconds": time.perf_counter() - clock})


def _stage_probe(config: PrismConfig, ctx, model, corpus: Corpus, layer: int):
    """Train the probe once (saved in the checkpoint dir so --resume reuses it) on the layer stage 2 reads."""
    saved = ctx.checkpoint_dir / "probe.pt" if ctx.out is not None else None
    if saved is not None and ctx.resume and saved.exists():
        state = torch.load(saved, weights_only=True)
        probe = make_probe(state["width"], tuple(state["hidden"]))
        probe.load_state_dict(state["weights"])
        return probe.eval().requires_grad_(False).to(ctx.device), state["layer"], state["stats"]
    forget = pooled_features(model, corpus, corpus.forget, layer, ctx.device)
    retain = pooled_features(model, corpus, corpus.retain, layer, ctx.device)
    features = torch.cat([forget, retain])
    labels = torch.cat([torch.ones(len(forget)), torch.zeros(len(retain))]).long()
    probe, train_acc, val_acc = train_probe(features, labels, config, ctx.seed)
    stats = {"probe_train_accuracy": train_acc, "probe_val_accuracy": val_acc}
    state = {"width": features.shape[1], "hidden": list(config.probe_hidden), "layer": layer,
             "weights": probe.state_dict(), "stats": stats}
    if saved is not None:
        torch.save(state, saved)
        torch.save(state, ctx.path("probe.pt"))
    return probe.to(ctx.device), layer, stats


def finish(ctx, config: UnlearnConfig, tokenizer, result: dict, technique: str, extra: dict) -> None:
    """Save the unlearned model and record the training metrics."""
    from toolkit.models.save import save_model

    history = result["history"]
    last = history[-1] if history else {}
    ctx.metrics.update({"steps": result["steps"], "steps_per_epoch": result["steps_per_epoch"],
                        "resumed_from": result["resumed_from"], **extra,
                        **{f"final_{k}": v for k, v in last.items() if k != "step"}})
    ctx.metrics["loss_history"] = history
    if ctx.out is not None:
        save_model(result["model"], tokenizer, ctx.path("model"), technique=technique, source=config.model,
                   paper=PAPER if technique == "unlearn.prism" else "", metadata={"technique": technique})
