"""Baselines PRISM is compared against: gradient ascent, NPO with a retain loss (MUSE `npo_gdr`), and RMU.

GA: Jang et al. 2023. NPO: Zhang et al. 2024, https://arxiv.org/abs/2404.05868 (MUSE code swj0419/muse_bench).
RMU: Li et al. 2024 (WMDP), https://arxiv.org/abs/2403.03218, code centerforaisafety/wmdp.
"""

from __future__ import annotations

import torch

from toolkit.core.errors import BadInputError
from toolkit.models.view import view_of
from toolkit.unlearn.config import GaConfig, NpoConfig, RmuConfig
from toolkit.unlearn.data import collate
from toolkit.unlearn.losses import mean_nll, npo_loss, rmu_loss, sequence_logprob
from toolkit.unlearn.run import run_unlearn
from toolkit.unlearn.train import StepInputs, hidden_states, sequence_logprobs


def ga_objective(config: GaConfig):
    def step(s: StepInputs) -> dict:
        forget = mean_nll(s.model(**s.forget).logits, s.forget["input_ids"], s.forget["attention_mask"])
        loss, logs = -forget, {"forget_nll": forget.item()}
        if config.retain_coeff > 0:
            retain = mean_nll(s.model(**s.retain).logits, s.retain["input_ids"], s.retain["attention_mask"])
            loss = loss + config.retain_coeff * retain
            logs["retain_nll"] = retain.item()
        s.backward(loss)
        return logs
    return step


def setup_ga(config: GaConfig, ctx, model, corpus):
    return ga_objective(config), trainable(model), {}


def npo_objective(config: NpoConfig, ref_logp: torch.Tensor):
    def step(s: StepInputs) -> dict:
        logits = s.model(**s.forget).logits
        ref = ref_logp[s.forget_index].to(logits.device)
        npo = npo_loss(sequence_logprob(logits, s.forget["input_ids"], s.forget["attention_mask"]), ref, config.beta)
        retain = mean_nll(s.model(**s.retain).logits, s.retain["input_ids"], s.retain["attention_mask"])
        s.backward(config.npo_coeff * npo + config.retain_coeff * retain)
        return {"npo": npo.item(), "retain_nll": retain.item()}
    return step


def setup_npo(config: NpoConfig, ctx, model, corpus):
    """NPO's reference log-likelihoods are the model's before any step (a cache instead of a frozen copy)."""
    return npo_objective(config, sequence_logprobs(model, corpus, corpus.forget, ctx.device)), trainable(model), {}


def rmu_layer(config: RmuConfig, model) -> int:
    layers = model.config.num_hidden_layers
    layer = config.layer if config.layer is not None else max(1, round(7 * layers / 32))
    if layer > layers:
        raise BadInputError(f"RMU layer {layer} > {layers} layers")
    return layer


def control_vector(width: int, coeff: float, seed: int) -> torch.Tensor:
    """c·u with u uniform in [0,1)^d normalised to unit length (the WMDP recipe)."""
    u = torch.rand(width, generator=torch.Generator().manual_seed(seed))
    return coeff * u / u.norm()


@torch.no_grad()
def frozen_retain_states(model, corpus, layer: int, device) -> list[torch.Tensor]:
    """Layer-ℓ states of every retain window under the original model (a cache instead of a frozen copy)."""
    return [hidden_states(model, {k: v.to(device) for k, v in collate([c], corpus.pad).items()}, layer)[1][0].cpu()
            for c in corpus.retain]


def rmu_objective(config: RmuConfig, layer: int, control: torch.Tensor, frozen: list[torch.Tensor]):
    def step(s: StepInputs) -> dict:
        _, h_forget = hidden_states(s.model, s.forget, layer)
        _, h_retain = hidden_states(s.model, s.retain, layer)
        target = torch.zeros_like(h_retain)
        for row, index in enumerate(s.retain_index):
            target[row, :frozen[index].shape[0]] = frozen[index].to(target.device)
        loss = rmu_loss(h_forget, control.to(h_forget.device), h_retain, target, config.alpha,
                        s.forget["attention_mask"].float(), s.retain["attention_mask"].float())
        s.backward(loss)
        return {"rmu_loss": loss.item()}
    return step


def setup_rmu(config: RmuConfig, ctx, model, corpus):
    """Train only the MLP down-projections of blocks ℓ-2..ℓ (hidden state ℓ is the output of block ℓ-1)."""
    layer = rmu_layer(config, model)
    view = view_of(model)
    model.requires_grad_(False)
    params = []
    for index in range(max(0, layer - 3), layer):
        module = view.blocks[index].get_submodule(view.mlp_out(index, "RMU").module)
        module.requires_grad_(True)
        params += list(module.parameters())
    frozen = frozen_retain_states(model, corpus, layer, ctx.device)
    control = control_vector(model.config.hidden_size, config.steering_coeff, ctx.seed)
    return rmu_objective(config, layer, control, frozen), params, {"rmu_layer": layer, "trained_tensors": len(params)}


def trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# the registry picks the objective from config.method (toolkit/unlearn/objectives/): one run path for all
run_ga = run_npo = run_rmu = run_unlearn
