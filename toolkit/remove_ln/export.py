"""Export a fully LN-free FakeLN model in two forms that give its logits:

(a) `plain`: a standard GPT-2 checkpoint (vanilla `GPT2LMHeadModel.from_pretrained`, no custom code). Each LN keeps
    its module but gets weight γ·√ε/σ and ε = 1e12, so sqrt(var + ε) rounds to √ε in fp32 and the LN is the affine
    map (x − mean)·γ/σ + β (official `remove_layernorm_by_scaling`). The ln_1 QK/V σ ratio is folded into c_attn.
(b) `folded`: every LN replaced by identity, (I − 11ᵀ/d)·diag(γ/σ) folded into the next linear, β into its bias;
    ln_f folds into an untied unembedding with a bias. Stored as `ln_free_folded.safetensors` (so vanilla
    from_pretrained fails loudly instead of adding LayerNorms back) and loaded with `load_folded`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from toolkit.core.errors import BadInputError
from toolkit.core.records import write_json
from toolkit.remove_ln.fakeln import FakeLNModel

PLAIN_EPS = 1e12
FOLDED_FILE = "ln_free_folded.safetensors"


def _require_removed(handle: FakeLNModel) -> None:
    if not handle.fully_removed():
        pending = [f.name for f in handle.all() if not bool(f.fake)]
        raise BadInputError(f"cannot export: LayerNorms still active ({', '.join(pending) or 'EOT/BOS special case'})",
                            "train through the whole removal schedule first")


def _base_copy(handle: FakeLNModel):
    """A fresh GPT2LMHeadModel with the FakeLN model's weights (LN params are γ, β; c_attn unwrapped)."""
    from transformers import GPT2LMHeadModel

    model = handle.model
    plain = GPT2LMHeadModel(copy.deepcopy(model.config)).to(next(model.parameters()).device).eval()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("remove_ln_specials")}
    renamed = {}
    for key, value in state.items():
        key = key.replace("attn.c_attn.c_attn.", "attn.c_attn.")
        key = key.replace("attn.c_attn.qk.", "ln_1.").replace("attn.c_attn.v.", "ln_1.")
        if key.endswith(("sigma_avg", "sigma_special", ".fake")):
            continue
        renamed[key] = value
    missing, unexpected = plain.load_state_dict(renamed, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"state mismatch: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    return plain


def _sqrt_eps(eps: float) -> torch.Tensor:
    return torch.sqrt(torch.tensor(eps, dtype=torch.float32))


@torch.no_grad()
def to_plain(handle: FakeLNModel):
    """(a): a vanilla GPT2LMHeadModel whose LNs compute the FakeLN affine maps."""
    _require_removed(handle)
    model = _base_copy(handle)
    model.config.layer_norm_epsilon = PLAIN_EPS
    root = _sqrt_eps(PLAIN_EPS)
    for block, qk, v, ln2 in zip(model.transformer.h, handle.ln1_qk, handle.ln1_v, handle.ln2):
        width = block.attn.c_attn.weight.shape[1] // 3
        ratio = v.sigma_avg / qk.sigma_avg  # LN output uses σ_v; Q/K columns rescaled to σ_qk
        beta = block.ln_1.bias.detach().clone()
        w_qk = block.attn.c_attn.weight[:, :2 * width]
        block.attn.c_attn.bias[:2 * width] += (1 - ratio) * (beta @ w_qk)
        w_qk.mul_(ratio)
        _scale_ln(block.ln_1, v.sigma_avg, root)
        _scale_ln(block.ln_2, ln2.sigma_avg, root)
    _scale_ln(model.transformer.ln_f, handle.ln_f.sigma_avg, root)
    return model


def _scale_ln(norm: nn.LayerNorm, sigma: torch.Tensor, root: torch.Tensor) -> None:
    norm.eps = PLAIN_EPS
    norm.weight.mul_(root.to(norm.weight.device) / sigma)


def _fold_into(weight_in_out: torch.Tensor, bias: torch.Tensor, gamma, beta, sigma):
    """Linear y = LN(x) @ W + b with LN(x) = C x ⊙ γ/σ + β  ->  y = x @ (C diag(γ/σ) W) + (b + β W)."""
    scaled = weight_in_out * (gamma / sigma).unsqueeze(1)
    centered = scaled - scaled.mean(0, keepdim=True)  # C is symmetric: C @ M subtracts the column means
    return centered, bias + beta @ weight_in_out


class LNFreeFolded(nn.Module):
    """Marker type for the folded model's identity norms (so scans can tell them from a missing module)."""

    def forward(self, x):
        return x


@torch.no_grad()
def to_folded(handle: FakeLNModel):
    """(b): GPT2LMHeadModel with identity norms, folded weights and an untied lm_head with a bias."""
    _require_removed(handle)
    model = _base_copy(handle)
    for block, qk, v, ln2 in zip(model.transformer.h, handle.ln1_qk, handle.ln1_v, handle.ln2):
        conv = block.attn.c_attn
        width = conv.weight.shape[1] // 3
        gamma, beta = block.ln_1.weight, block.ln_1.bias
        w_qk, b_qk = _fold_into(conv.weight[:, :2 * width], conv.bias[:2 * width], gamma, beta, qk.sigma_avg)
        w_v, b_v = _fold_into(conv.weight[:, 2 * width:], conv.bias[2 * width:], gamma, beta, v.sigma_avg)
        conv.weight.copy_(torch.cat([w_qk, w_v], 1))
        conv.bias.copy_(torch.cat([b_qk, b_v]))
        fc = block.mlp.c_fc
        w_fc, b_fc = _fold_into(fc.weight, fc.bias, block.ln_2.weight, block.ln_2.bias, ln2.sigma_avg)
        fc.weight.copy_(w_fc)
        fc.bias.copy_(b_fc)
        block.ln_1, block.ln_2 = LNFreeFolded(), LNFreeFolded()
    ln_f = model.transformer.ln_f
    unembed = model.lm_head.weight.t().clone()  # (d, vocab)
    w_u, b_u = _fold_into(unembed, torch.zeros(unembed.shape[1], device=unembed.device), ln_f.weight, ln_f.bias,
                          handle.ln_f.sigma_avg)
    model.transformer.ln_f = LNFreeFolded()
    model.config.tie_word_embeddings = False
    head = nn.Linear(w_u.shape[0], w_u.shape[1], bias=True).to(w_u.device)
    head.weight.copy_(w_u.t())
    head.bias.copy_(b_u)
    model.lm_head = head
    return model


def save_folded(model, tokenizer, out: Path, metadata: dict, card: str) -> None:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config["iclrkit"] = metadata
    write_json(out / "config.json", config)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / FOLDED_FILE), metadata={"format": "pt", "iclrkit": "remove-ln folded"})
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    (out / "README.md").write_text(card)


def is_folded_dir(path: str | Path) -> bool:
    return (Path(path) / FOLDED_FILE).is_file()


def load_folded(path: str | Path, device: str = "cpu"):
    """The folded LN-free model: GPT2LMHeadModel with identity norms and a biased, untied lm_head."""
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel

    path = Path(path)
    if not is_folded_dir(path):
        raise BadInputError(f"{path} has no {FOLDED_FILE}: not a folded remove-ln export")
    config = GPT2Config.from_dict({k: v for k, v in json.loads((path / "config.json").read_text()).items()
                                   if k != "iclrkit"})
    config.tie_word_embeddings = False
    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:
        block.ln_1, block.ln_2 = LNFreeFolded(), LNFreeFolded()
    model.transformer.ln_f = LNFreeFolded()
    model.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=True)
    model.load_state_dict(load_file(str(path / FOLDED_FILE)), strict=True)
    return model.to(device).eval()


def has_no_layernorm(model: nn.Module) -> bool:
    """Structural check for the folded form: no LayerNorm/FakeLN module left."""
    from toolkit.remove_ln.fakeln import FakeLayerNorm

    return not any(isinstance(m, (nn.LayerNorm, FakeLayerNorm)) for m in model.modules())
