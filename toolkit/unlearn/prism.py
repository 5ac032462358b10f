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

import torch
import torch.nn.functional as F

from toolkit.core.errors import BadInputError
from toolkit.unlearn.config import PrismConfig
from toolkit.unlearn.losses import (
    decouple,
    fgsm_probe_loss,
    mean_nll,
    npo_loss,
    probe_weight,
    sam_perturbation,
    sequence_logprob,
)
from toolkit.unlearn.run import run_unlearn
from toolkit.unlearn.train import (
    Corpus,
    StepInputs,
    hidden_states,
    mean_pool,
    sequence_logprobs,
)


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


def setup(config: PrismConfig, ctx, model, corpus: Corpus):
    """The registered objective's setup (toolkit/unlearn/objectives/prism.py): stage 1 (the probe) and the frozen NPO
    reference, then the stage-2 step over every trainable tensor."""
    layer = config.probe_layer if config.probe_layer is not None else default_layer(model)
    if layer > model.config.num_hidden_layers:
        raise BadInputError(f"probe_layer {layer} > {model.config.num_hidden_layers} layers")
    probe, layer, probe_stats = _stage_probe(config, ctx, model, corpus, layer)
    ref_logp = sequence_logprobs(model, corpus, corpus.forget, ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    return prism_objective(config, ref_logp, probe, layer), params, {**probe_stats, "probe_layer": layer}


run_prism = run_unlearn  # config.method ("prism") picks the registered objective


def _stage_probe(config: PrismConfig, ctx, model, corpus: Corpus, layer: int):
    """Train the probe once (saved in the checkpoint dir so --resume reuses it) on the layer stage 2 reads."""
    saved = ctx.checkpoint_dir / "probe.pt" if ctx.out is not None else None
    if saved is not None and ctx.resume and saved.exists():
        from toolkit.core.errors import reading_checkpoint

        with reading_checkpoint(saved):
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
