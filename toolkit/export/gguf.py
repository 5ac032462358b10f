"""GGUF Q4_0 export for llama.cpp (written with the `gguf` package), for every architecture llama.cpp has a loader for
among those iclrkit runs (`LAYOUTS`); the rest are refused before anything is loaded (`check_architecture`).

Q4_0 stores each run of 32 input columns of a row as an fp16 scale d and 32 unsigned 4-bit codes q, w = d·(q − 8):
exactly iclrkit's symmetric INT4 grid (codes c = q − 8 ∈ [−8, 7]). A per-channel (or grouped, group a multiple of
32) scale s maps onto it by giving every block of the row d = fp16(s) (round to nearest even) with the codes
unchanged, so the only change is that fp16 rounding of the scale: each weight moves by at most |w|·2⁻¹¹ relative,
and pruned weights (code 0 → q = 8) stay exactly zero. Scales that fp16 cannot hold (underflow/overflow) are refused.

What llama.cpp expects differs per architecture; `LAYOUTS` holds it as data (learned from llama.cpp's converter and
its loaders, not copied):
- tensor names from `gguf.get_tensor_name_map(arch, blocks)` (token_embd, blk.N.attn_q, ..., output_norm, output);
  a tied head is not written (llama.cpp reuses token_embd); a multimodal wrapper's text decoder only;
- `permute_qk`: llama.cpp's "normal" RoPE rotates adjacent pairs, transformers' rotate-half pairs (i, i + d/2): the
  q/k rows (and biases) are permuted per head (Llama, Mixtral, Granite, SmolLM3); NEOX-RoPE architectures and
  Cohere (already adjacent pairs) are written as they are;
- `qkv`: a fused q/k/v projection grouped per KV head ([q…, k, v] per group: Falcon, GPT-NeoX, BLOOM) is regrouped to
  [all q | all k | all v] (a row permutation: codes and scales move with their rows);
- norms with a (1 + w) scale (Gemma's, measured by the ModelView) are written as 1 + w (llama.cpp multiplies by w);
- fused experts (transformers 5 `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) become ffn_gate_exps /
  ffn_up_exps [E, I, H] and ffn_down_exps [E, H, I], each expert's rows Q4_0 with its own scales;
- Gemma 2/3: llama.cpp scales attention by 1/√head_dim (1/√(hidden/heads) for the 27B shapes) where transformers uses
  query_pre_attn_scalar^-½; the ratio c is folded into q (Gemma 3: its q-norm weight, float; Gemma 2: the q rows'
  Q4_0 scales, d = fp16(c·s), exact when c is a power of two);
- metadata keys (norm eps, rope dimensions and base, sliding window and its per-layer pattern, soft-capping, logit /
  embedding / residual / attention scales, expert sizes, parallel residual) by `KEY_WRITERS`.
llama.cpp has no online rotation, so rotated down_proj linears are folded (W·Q_intᵀ) and stored F32.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.quantized import QuantizedModel

log = logging.getLogger("iclrkit")

BLOCK = 32
ROUNDING = ("Q4_0 mapping: every 32-column block of a row gets d = fp16(row scale) (round to nearest even), codes "
            "unchanged; each weight moves by at most 2^-11 of its value and pruned weights stay exactly 0.")


@dataclass(frozen=True)
class GgufLayout:
    """What llama.cpp's loader for one architecture expects that the model itself does not say."""

    norm: str = "rms"  # "rms": RMSNorm eps key (attention.layer_norm_rms_epsilon); "layer": LayerNorm (…_epsilon)
    rope: bool = True  # RoPE keys (dimension count, base); False: learned positions / ALiBi (GPT-2, BLOOM)
    permute_qk: bool = False  # llama.cpp's adjacent-pair RoPE on transformers' rotate-half rows: permute q/k rows
    qkv: str = "concat"  # fused q/k/v rows: "concat" (written as they are) | "grouped" (per KV group, regrouped)
    keys: tuple[str, ...] = ()  # extra metadata, by name in KEY_WRITERS
    checks: tuple[str, ...] = ()  # config conventions llama.cpp hard-codes, by name in CHECKS
    moe_norm_topk: bool | None = None  # llama.cpp renormalises the top-k routing weights (fixed per architecture)
    rope_factors: bool = False  # the loader reads a rope_freqs tensor (Llama-3 RoPE scaling is written as one)
    sliding: str = "ignored"  # "pattern": window + per-layer pattern honoured; "ignored": full attention everywhere
    query_scale_27b: int | None = None  # Gemma: attention scale 1/√head_dim, 1/√(hidden/heads) at this depth (27B)


LAYOUTS: dict[str, GgufLayout] = {  # keyed by llama.cpp's architecture name (toolkit.models.archs gguf_arch)
    "llama": GgufLayout(permute_qk=True, rope_factors=True, moe_norm_topk=True),  # also Mistral, Mixtral
    "qwen2": GgufLayout(),
    "qwen3": GgufLayout(),
    "qwen2moe": GgufLayout(keys=("expert_ff", "shared_ff"), checks=("every_block_moe",), moe_norm_topk=False),
    "qwen3moe": GgufLayout(keys=("expert_ff",), checks=("every_block_moe",), moe_norm_topk=True),
    "olmoe": GgufLayout(moe_norm_topk=False, checks=("k_norm_full_width",)),
    "phi3": GgufLayout(keys=("phi3_window", "rope_orig_ctx")),
    "phi2": GgufLayout(norm="layer", checks=("no_qk_layernorm",)),
    "gemma": GgufLayout(),
    "gemma2": GgufLayout(keys=("softcapping", "sliding_window"), sliding="pattern", query_scale_27b=46),
    "gemma3": GgufLayout(keys=("softcapping", "sliding_window", "rope_base_swa"), sliding="pattern",
                         query_scale_27b=62, checks=("no_attn_softcapping",)),
    "olmo2": GgufLayout(keys=("sliding_window",), sliding="pattern"),
    "granite": GgufLayout(permute_qk=True, rope_factors=True, keys=("granite_scales",)),
    "command-r": GgufLayout(norm="layer", keys=("logit_scale",), checks=("no_qk_norm",)),
    "starcoder2": GgufLayout(norm="layer"),
    "stablelm": GgufLayout(norm="layer", keys=("parallel_residual",), checks=("no_qk_layernorm",)),
    "smollm3": GgufLayout(permute_qk=True, checks=("nope_every_fourth",)),
    "exaone4": GgufLayout(keys=("sliding_window",), rope_factors=True, checks=("exaone4_window",)),
    "falcon": GgufLayout(norm="layer", qkv="grouped", keys=("falcon_layout",), checks=("falcon_parallel",)),
    "gptneox": GgufLayout(norm="layer", qkv="grouped", keys=("parallel_residual",)),
    "gpt2": GgufLayout(norm="layer", rope=False),
    "bloom": GgufLayout(norm="layer", rope=False, qkv="grouped"),
}
REFUSED: dict[str, str] = {  # llama.cpp names the architecture but cannot run it as a causal LM from this writer
    "gptj": "llama.cpp declares the name 'gptj' but has no loader or graph for it (and its converter none)",
    "bert": "an encoder (llama.cpp serves it for embeddings); this writer writes causal language models",
}


def _text(config):
    return getattr(config, "text_config", None) or config


def _gguf_arch(model_type: str | None) -> str:
    """llama.cpp's architecture name for a model type, or one BadInputError line saying why there is none here."""
    from toolkit.models.archs import traits

    arch = traits(model_type).gguf_arch
    served = ", ".join(sorted(LAYOUTS))
    if arch is None:
        raise BadInputError(f"--export gguf: llama.cpp has no loader for {model_type} (architectures written: "
                            f"{served})", "use the packed or compressed-tensors export")
    if arch in REFUSED:
        raise BadInputError(f"--export gguf: {model_type} is refused: {REFUSED[arch]}",
                            "use the packed or compressed-tensors export")
    if arch not in LAYOUTS:
        raise BadInputError(f"--export gguf: llama.cpp serves {model_type} as '{arch}', but this writer has no layout "
                            f"for it (architectures written: {served})", "use the packed or compressed-tensors export")
    return arch


def check_architecture(model: str | object | None) -> str:
    """The one gate, before anything is loaded: a model type, or a config (then also the conventions llama.cpp
    hard-codes for the architecture, and the RoPE variant). Returns llama.cpp's architecture name."""
    config = None if model is None or isinstance(model, str) else model
    model_type = getattr(config, "model_type", None) if config is not None else model
    arch = _gguf_arch(model_type)
    if config is not None:
        layout = LAYOUTS[arch]
        text = _text(config)
        problems = [why for name in layout.checks if (why := CHECKS[name](text)) is not None]
        problems += _rope_problems(text, layout)
        if layout.moe_norm_topk is not None and _experts(text):
            normalised = bool(getattr(text, "norm_topk_prob", True))  # Mixtral's router always renormalises
            if normalised != layout.moe_norm_topk:
                problems.append(f"norm_topk_prob={normalised}, but llama.cpp's '{arch}' "
                                f"{'always' if layout.moe_norm_topk else 'never'} renormalises the top-k routing "
                                "weights")
        if problems:
            raise BadInputError(f"--export gguf: {model_type} as llama.cpp's '{arch}' would compute a different "
                                f"model: {'; '.join(problems)}", "use the packed or compressed-tensors export")
    return arch


def _experts(text) -> int:
    return int(getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None) or 0)


# -- config conventions llama.cpp hard-codes (None = holds) -----------------------------------------------------------

def _every_block_moe(text):
    dense = list(getattr(text, "mlp_only_layers", None) or [])
    step = int(getattr(text, "decoder_sparse_step", 1) or 1)
    if dense or step != 1:
        return (f"blocks with a dense MLP (mlp_only_layers={dense}, decoder_sparse_step={step}); llama.cpp's loader "
                "expects experts in every block")
    return None


def _no_flag(attr: str, what: str):
    def check(text):
        return f"{attr}=True ({what}), which this writer does not lay out" if getattr(text, attr, False) else None
    return check


def _nope_every_fourth(text):
    flags = list(getattr(text, "no_rope_layers", None) or [])[:text.num_hidden_layers]
    expected = [int((i + 1) % 4 != 0) for i in range(text.num_hidden_layers)]
    if flags and [int(f) for f in flags] != expected:
        return (f"RoPE layers {flags} (no_rope_layers); llama.cpp's smollm3 skips RoPE on every fourth layer "
                f"exactly ({expected})")
    return None


def _exaone4_window(text):
    types = list(getattr(text, "layer_types", None) or [])
    if getattr(text, "sliding_window", None) and "full_attention" in types and text.num_hidden_layers != 64:
        return (f"{types.count('full_attention')} full-attention (NoPE) layers among sliding ones; llama.cpp reads "
                "EXAONE 4's sliding-window pattern only for 64-layer models and otherwise applies RoPE and full "
                "attention to every layer")
    return None


def _k_norm_full_width(text):
    heads, kv = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if kv != heads:
        return (f"grouped-query attention ({kv} KV heads for {heads} query heads); llama.cpp's olmoe normalises k over "
                "the full hidden width, so its k-norm cannot hold this model's narrower one")
    return None


def _falcon_parallel(text):
    if getattr(text, "alibi", False):
        return "ALiBi positions (alibi=True); llama.cpp's falcon uses RoPE"
    if not getattr(text, "parallel_attn", True) and not getattr(text, "new_decoder_architecture", False):
        return "sequential attention and MLP (parallel_attn=False); llama.cpp's falcon runs them in parallel"
    if getattr(text, "bias", False):
        return "linear biases (bias=True); llama.cpp's falcon has none"
    return None


CHECKS = {
    "every_block_moe": _every_block_moe,
    "no_qk_layernorm": _no_flag("qk_layernorm", "per-head q/k LayerNorms"),
    "no_qk_norm": _no_flag("use_qk_norm", "per-head q/k norms"),
    "no_attn_softcapping": lambda t: ("attention logit soft-capping; llama.cpp's gemma3 has none"
                                      if getattr(t, "attn_logit_softcapping", None) else None),
    "nope_every_fourth": _nope_every_fourth,
    "exaone4_window": _exaone4_window,
    "falcon_parallel": _falcon_parallel,
    "k_norm_full_width": _k_norm_full_width,
}


def _rope_sets(text) -> dict[str, dict]:
    """{"": params} or, for per-layer-type RoPE (Gemma 3), {"full_attention": ..., "sliding_attention": ...}."""
    rope = dict(getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {})
    if rope and all(isinstance(v, dict) for v in rope.values()):
        return rope
    return {"": rope}


def _rope_problems(text, layout: GgufLayout) -> list[str]:
    if not layout.rope:
        return []
    problems = []
    for kind, params in _rope_sets(text).items():
        rope_type = params.get("rope_type") or params.get("type") or "default"
        allowed = ("default", "linear") + (("llama3",) if layout.rope_factors else ())
        if kind == "sliding_attention":
            allowed = ("default",)  # llama.cpp scales only the global layers' positions
        if rope_type not in allowed:
            problems.append(f"RoPE type {rope_type!r}{f' ({kind})' if kind else ''} (written: {', '.join(allowed)})")
    return problems


# -- metadata ---------------------------------------------------------------------------------------------------------

def _sliding_window(w, text, dims):
    window = getattr(text, "sliding_window", None)
    if not window:
        return
    w.add_sliding_window(int(window))
    types = getattr(text, "layer_types", None)
    if types:
        w.add_sliding_window_pattern([t == "sliding_attention" for t in types[:dims["layers"]]])


def _softcapping(w, text, dims):
    if getattr(text, "attn_logit_softcapping", None):
        w.add_attn_logit_softcapping(float(text.attn_logit_softcapping))
    if getattr(text, "final_logit_softcapping", None):
        w.add_final_logit_softcapping(float(text.final_logit_softcapping))


def _rope_base_swa(w, text, dims):
    local = _rope_sets(text).get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        w.add_rope_freq_base_swa(float(local))


def _granite_scales(w, text, dims):
    for attr, add in (("attention_multiplier", w.add_attention_scale), ("embedding_multiplier", w.add_embedding_scale),
                      ("residual_multiplier", w.add_residual_scale)):
        if getattr(text, attr, None) is not None:
            add(float(getattr(text, attr)))
    w.add_logit_scale(float(getattr(text, "logits_scaling", 1.0) or 1.0))


KEY_WRITERS = {
    "sliding_window": _sliding_window,
    "softcapping": _softcapping,
    "rope_base_swa": _rope_base_swa,
    "granite_scales": _granite_scales,
    "logit_scale": lambda w, t, d: w.add_logit_scale(float(t.logit_scale)),
    "expert_ff": lambda w, t, d: w.add_expert_feed_forward_length(d["expert_ff"]),
    "shared_ff": lambda w, t, d: d.get("shared_ff") and w.add_expert_shared_feed_forward_length(d["shared_ff"]),
    "phi3_window": lambda w, t, d: w.add_sliding_window(int(getattr(t, "sliding_window", None) or 0)),
    "rope_orig_ctx": lambda w, t, d: w.add_rope_scaling_orig_ctx_len(
        int(getattr(t, "original_max_position_embeddings", None) or t.max_position_embeddings)),
    "parallel_residual": lambda w, t, d: w.add_parallel_residual(bool(getattr(t, "use_parallel_residual", True))),
    "falcon_layout": lambda w, t, d: w.add_tensor_data_layout("jploski"),
}


def _dims(q: QuantizedModel, arch: str) -> dict:
    """Sizes read from the model (its config and the discovered block), the way llama.cpp names them."""
    view, text = q.view, _text(q.model.config)
    d = view.dims()
    heads = int(d["heads"])
    head_dim = int(getattr(text, "head_dim", None) or d["hidden"] // heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    if arch == "falcon":  # multi-query unless the new decoder layout names its KV heads
        kv = int(text.num_kv_heads) if getattr(text, "new_decoder_architecture", False) else \
            (1 if getattr(text, "multi_query", True) else heads)
    layout = view.layout(0)
    block = view.blocks[0]
    mlp_out = [g for g in layout.groups if "mlp_out" in g.roles]
    expert_out = [g for g in layout.groups if g.role == "experts_out"]
    dense_ff = mlp_out[0].slots[0].shape(block)[1] if mlp_out else None
    expert_ff = expert_out[0].slots[0].shape(block)[1] if expert_out else None
    rotary = 1.0
    for params in _rope_sets(text).values():
        rotary = float(params.get("partial_rotary_factor", rotary))
    rotary = float(getattr(text, "partial_rotary_factor", None) or rotary)
    return {"layers": len(view), "hidden": int(d["hidden"]), "heads": heads, "kv_heads": kv, "head_dim": head_dim,
            "ff": int(expert_ff or dense_ff or 4 * d["hidden"]), "expert_ff": expert_ff,
            "shared_ff": dense_ff if expert_ff else None, "experts": int(d["experts"]),
            "rope_dims": int(rotary * head_dim)}


def _rope_factors(text, head_dim: int) -> np.ndarray | None:
    """Llama-3 RoPE scaling as llama.cpp's rope_freqs divisors: default inverse frequencies over the scaled ones,
    both computed by transformers' own RoPE initialisation."""
    params = _rope_sets(text).get("", {})
    if params.get("rope_type") != "llama3":
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, attention = ROPE_INIT_FUNCTIONS["llama3"](text, "cpu")
    if abs(float(attention) - 1.0) > 1e-12:
        raise BadInputError(f"llama3 RoPE with attention scaling {attention}: not written to GGUF")
    base = float(params.get("rope_theta", 10000.0))
    default = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (default / scaled.double()).float().numpy()


def _query_scale(text, layout: GgufLayout, dims: dict) -> float:
    """c with llama.cpp's attention scale · c = transformers' (Gemma's query_pre_attn_scalar^-½)."""
    if layout.query_scale_27b is None or getattr(text, "query_pre_attn_scalar", None) is None:
        return 1.0
    llama_denominator = (dims["hidden"] / dims["heads"] if dims["layers"] == layout.query_scale_27b
                         else dims["head_dim"])
    return math.sqrt(llama_denominator / float(text.query_pre_attn_scalar))


def _write_metadata(writer, q: QuantizedModel, arch: str, layout: GgufLayout, dims: dict) -> list[str]:
    import gguf

    text = _text(q.model.config)
    notes = []
    writer.add_name(Path(str(q.provenance.get("source_model", "iclrkit"))).name or "iclrkit")
    writer.add_context_length(int(getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions")))
    writer.add_embedding_length(dims["hidden"])
    writer.add_block_count(dims["layers"])
    writer.add_feed_forward_length(dims["ff"])
    writer.add_head_count(dims["heads"])
    writer.add_head_count_kv(dims["kv_heads"])
    writer.add_key_length(dims["head_dim"])
    writer.add_value_length(dims["head_dim"])
    if layout.norm == "rms":
        writer.add_layer_norm_rms_eps(float(getattr(text, "rms_norm_eps", None) or getattr(text, "norm_eps")))
    else:
        eps = next(getattr(text, a) for a in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps")
                   if getattr(text, a, None) is not None)
        writer.add_layer_norm_eps(float(eps))
    if layout.rope:
        writer.add_rope_dimension_count(dims["rope_dims"])
        sets = _rope_sets(text)
        main = sets.get("full_attention", sets.get("", {}))
        writer.add_rope_freq_base(float(main.get("rope_theta", getattr(text, "rope_theta", 10000.0))))
        if main.get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(main["factor"]))
    if dims["experts"]:
        writer.add_expert_count(dims["experts"])
        writer.add_expert_used_count(int(text.num_experts_per_tok))
    writer.add_vocab_size(int(q.model.get_input_embeddings().weight.shape[0]))
    for key in layout.keys:
        KEY_WRITERS[key](writer, text, dims)
    window = getattr(text, "sliding_window", None)
    if window and layout.sliding == "ignored" and getattr(text, "use_sliding_window", True) is not False \
            and window < int(getattr(text, "max_position_embeddings", 0) or 0):
        notes.append(f"transformers attends within a sliding window of {window} tokens; llama.cpp's '{arch}' "
                     f"attends to the whole context: the two agree on contexts up to {window} tokens")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q4_0))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return notes


def check_exportable(q: QuantizedModel) -> None:
    check_architecture(q.model.config)
    if q.bits != 4:
        raise BadInputError(f"GGUF Q4_0 holds 4-bit weights; this model has {q.bits}-bit weights")
    a_bits, kv_bits = int(q.metadata.get("a_bits", 16)), int(q.metadata.get("kv_bits", 16))
    if a_bits < 16 or kv_bits < 16:
        raise BadInputError(f"GGUF Q4_0 is weight-only; this model quantizes activations to {a_bits} bits and the KV "
                            f"cache to {kv_bits} bits, which llama.cpp would not reproduce; such models keep "
                            "iclrkit's packed format", "serve packed/ with iclrkit (eval ppl / eval tasks)")
    for path, grid in q.linears.items():
        if grid.codes.shape[1] % BLOCK:
            raise BadInputError(f"{path}: {grid.codes.shape[1]} input columns are not a multiple of {BLOCK} (Q4_0)")
        if grid.group_size is not None and grid.group_size % BLOCK:
            raise BadInputError(f"{path}: group size {grid.group_size} is not a multiple of {BLOCK} (Q4_0)")
    experts = [q.view.layout(i).experts is not None for i in range(len(q.view))]
    if any(experts) and not all(experts):
        raise BadInputError("--export gguf: blocks with and without experts; llama.cpp's loaders expect experts in "
                            "every block")


# -- tensors ----------------------------------------------------------------------------------------------------------

def permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k row order → llama.cpp's: within each head, the RoPE half-pairs (i, i+d/2) become adjacent rows."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def regroup_qkv(rows: np.ndarray, kv_heads: int, heads: int, head_dim: int) -> np.ndarray:
    """Rows of a q/k/v projection grouped per KV head ([q × heads/kv, k, v] per group; per head when kv = heads)
    → [all q | all k | all v]."""
    per = heads // kv_heads
    grouped = rows.reshape(kv_heads, per + 2, head_dim, *rows.shape[1:])
    q = grouped[:, :per].reshape(heads * head_dim, *rows.shape[1:])
    k = grouped[:, per].reshape(kv_heads * head_dim, *rows.shape[1:])
    v = grouped[:, per + 1].reshape(kv_heads * head_dim, *rows.shape[1:])
    return np.concatenate([q, k, v], axis=0)


def q4_0_bytes(codes: np.ndarray, block_scales: np.ndarray) -> np.ndarray:
    """codes int [rows, cols] in [−8, 7], block_scales [rows, cols/32] → uint8 [rows, cols/32·18] Q4_0 blocks."""
    rows, cols = codes.shape
    blocks = cols // BLOCK
    q = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, blocks, BLOCK)
    qs = q[..., :16] | (q[..., 16:] << 4)
    d = block_scales.astype(np.float16).reshape(rows, blocks, 1).view(np.uint8)
    return np.concatenate([d, qs], axis=-1).reshape(rows, blocks * 18)


def _block_scales(grid) -> np.ndarray:
    cols = grid.codes.shape[1]
    scales = grid.scales.float().numpy()
    if grid.group_size is None:
        return np.repeat(scales, cols // BLOCK, axis=1)
    return np.repeat(scales, grid.group_size // BLOCK, axis=1)[:, :cols // BLOCK]


def _fp16_scales(path: str, scales: np.ndarray, codes: np.ndarray) -> np.ndarray:
    half = scales.astype(np.float16)
    used = np.abs(codes.reshape(*scales.shape, -1)).max(-1) > 0
    if not np.isfinite(half).all() or (used & (half == 0)).any():
        raise BadInputError(f"{path}: a weight scale does not fit fp16 (Q4_0 stores fp16 block scales)")
    return half


class _Rows:
    """One tensor on its way into the file: Q4_0 (codes + block scales, rows first) or float (rows first)."""

    def __init__(self, codes=None, scales=None, value=None, float32: bool = False):
        self.codes, self.scales, self.value = codes, scales, value
        self.float32 = float32  # a float tensor F16 cannot hold exactly (folded rotations)

    def map_rows(self, fn) -> _Rows:
        if self.codes is not None:
            return _Rows(fn(self.codes), fn(self.scales))
        return _Rows(value=fn(self.value), float32=self.float32)

    def scale_rows(self, c: float) -> _Rows:
        if self.codes is not None:
            return _Rows(self.codes, self.scales * np.float32(c))
        return _Rows(value=(self.value.astype(np.float64) * c).astype(np.float32), float32=True)

    @staticmethod
    def stack(parts: list[_Rows]) -> _Rows:
        if all(p.codes is not None for p in parts):
            return _Rows(np.stack([p.codes for p in parts]), np.stack([p.scales for p in parts]))
        return _Rows(value=np.stack([p.value if p.value is not None else p.dequantized() for p in parts]))

    def dequantized(self) -> np.ndarray:
        return self.codes.astype(np.float32) * np.repeat(self.scales.astype(np.float32), BLOCK, axis=-1)


def _norm_offsets(view) -> dict[str, float]:
    """Full module path → the offset of its scale ((1 + w) norms: 1.0), for every norm of the model."""
    from toolkit.models.layout import is_norm
    from toolkit.models.norms import norm_info

    offsets = {}
    for index in range(len(view)):
        for path, info in view.layout(index).norms.items():
            offsets[f"{view.block_path(index)}.{path}"] = info.offset
    for name, module in view.model.named_modules():
        if name and name not in offsets and is_norm(module) and getattr(module, "weight", None) is not None \
                and not name.startswith(view.layers_path + "."):
            offsets[name] = norm_info(name, module).offset
    return offsets


def _name_for(names, name: str, decoder: str) -> str | None:
    """gguf's name for a state-dict tensor: as it is, without the decoder's own prefix (BLOOM's `transformer.`), or
    with a multimodal wrapper's text-decoder prefix (model.language_model.) read as the plain `model.`."""
    candidates = [name]
    if decoder and name.startswith(decoder + "."):
        rest = name[len(decoder) + 1:]
        candidates += [rest, f"model.{rest}"]
    for candidate in candidates:
        found = names.get_name(candidate, try_suffixes=(".weight", ".bias"))
        if found is not None:
            return found
    return None


def _kind(gguf_name: str) -> str:
    """blk.3.attn_q.weight → attn_q; output_norm.weight → output_norm."""
    parts = gguf_name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def save_gguf(q: QuantizedModel, out: Path, filename: str = "model-Q4_0.gguf", card: dict | None = None) -> dict:
    """Write OUT/model-Q4_0.gguf and OUT/README.md; returns what the file holds."""
    import gguf

    from toolkit.export.card import write_card
    from toolkit.export.compressed_tensors import _folded_down_proj
    from toolkit.models.view import _is_conv1d

    check_exportable(q)
    arch = check_architecture(q.model.config)
    layout = LAYOUTS[arch]
    view, model = q.view, q.model
    text = _text(model.config)
    dims = _dims(q, arch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / filename
    model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(model_arch, dims["layers"])
    writer = gguf.GGUFWriter(str(target), arch)
    notes = _write_metadata(writer, q, arch, layout, dims)
    if q.tokenizer is not None:
        _tokenizer_metadata(writer, q.tokenizer, int(model.get_input_embeddings().weight.shape[0]))
    folded = _folded_down_proj(q)
    offsets = _norm_offsets(view)
    c = _query_scale(text, layout, dims)
    decoder = view.layers_path.rsplit(".", 1)[0] if "." in view.layers_path else ""
    has_q_norm = any(_kind(_name_for(names, f"{view.block_path(0)}.{path}.weight", decoder) or "x") == "attn_q_norm"
                     for path in view.layout(0).qk_norms)  # Gemma 3's q-norm takes the attention-scale fold
    head = view.lm_head
    head_names = {n for n, m in model.named_modules() if m is head and head is not None}
    modules = dict(model.named_modules())
    expert_grids: dict[str, dict[int, object]] = {}  # fused parameter → {expert: grid}
    for path, grid in q.linears.items():
        block, slot = view.resolve(path)
        if slot.kind == "expert":
            expert_grids.setdefault(view.param_name(path), {})[slot.expert] = grid

    tensors: list[tuple[str, _Rows]] = []
    skipped, seen = [], set()
    for name, tensor in model.state_dict().items():
        module_path, param = name.rsplit(".", 1)
        if tensor.data_ptr() in seen and tensor.numel():
            continue  # a tied head: llama.cpp reuses token_embd
        seen.add(tensor.data_ptr())
        if name in expert_grids or (tensor.dim() == 3 and param in ("gate_up_proj", "down_proj")):
            tensors += _expert_tensors(name, tensor, expert_grids.get(name, {}), view)
            continue
        inside = not decoder or name.startswith(decoder + ".") or module_path in head_names
        gguf_name = _name_for(names, name, decoder)
        if gguf_name is None:
            if "rotary_emb" in name or not inside:
                skipped.append(name)  # vision towers of multimodal wrappers, RoPE caches
                continue
            raise BadInputError(f"--export gguf: no llama.cpp '{arch}' tensor name for {name}")
        module = modules.get(module_path)
        if module_path in q.linears and param == "weight" and module_path not in folded:
            grid = q.linears[module_path]
            codes = grid.codes.numpy()
            rows = _Rows(codes, _block_scales(grid))
        else:
            value = folded[module_path] if module_path in folded and param == "weight" else tensor.detach().float()
            array = value.cpu().numpy().astype(np.float32)
            if module is not None and _is_conv1d(module) and param == "weight" and module_path not in folded:
                array = array.T.copy()  # Conv1D stores (in, out)
            if param == "weight" and offsets.get(module_path):
                array = array + np.float32(offsets[module_path])  # (1 + w) norms: llama.cpp multiplies by w
            rows = _Rows(value=array, float32=module_path in folded or bool(offsets.get(module_path)))
        kind = _kind(gguf_name)
        if layout.permute_qk and kind in ("attn_q", "attn_k"):
            rows = rows.map_rows(lambda r, n=dims["heads"] if kind == "attn_q" else dims["kv_heads"]:
                                 permute_rows(r, n))
        if layout.qkv == "grouped" and kind == "attn_qkv":
            rows = rows.map_rows(lambda r: regroup_qkv(r, dims["kv_heads"], dims["heads"], dims["head_dim"]))
        if c != 1.0 and ((kind == "attn_q_norm" and has_q_norm) or (kind == "attn_q" and not has_q_norm)):
            rows = rows.scale_rows(c)
        tensors.append((gguf_name, rows))
    factors = _rope_factors(text, dims["head_dim"]) if layout.rope_factors else None
    if factors is not None:
        tensors.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", _Rows(value=factors)))

    counts = {"Q4_0": 0, "F32": 0, "F16": 0}
    half_ok = q.dense_dtype == torch.float16 and int(q.metadata.get("embed_bits", 16)) >= 16
    for gguf_name, rows in tensors:
        if rows.codes is not None:
            flat_codes = rows.codes.reshape(-1, rows.codes.shape[-1])
            scales = _fp16_scales(gguf_name, rows.scales.reshape(-1, rows.scales.shape[-1]), flat_codes)
            raw = q4_0_bytes(flat_codes, scales).reshape(*rows.codes.shape[:-1], -1)
            writer.add_tensor(gguf_name, raw, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            counts["Q4_0"] += 1
            continue
        array = np.ascontiguousarray(rows.value, dtype=np.float32)
        half = half_ok and array.ndim == 2 and not rows.float32  # float16 in a packed file: F16 is exact
        writer.add_tensor(gguf_name, array.astype(np.float16) if half else array)
        counts["F16" if half else "F32"] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if skipped:
        notes.append(f"{len(skipped)} tensors outside the text decoder are not written (e.g. {skipped[0]}); "
                     "llama.cpp serves a vision tower as a separate mmproj file")
    if c != 1.0:
        notes.append(f"attention scale: transformers uses query_pre_attn_scalar^-1/2, llama.cpp's '{arch}' another "
                     f"constant; the ratio {c:.6g} is folded into "
                     f"{'the q-norm weights' if has_q_norm else 'the q rows (Q4_0 scales d = fp16(c * s))'}")
    for note in notes:
        log.warning("gguf: %s", note)
    summary = {"format": "GGUF Q4_0 (llama.cpp)", "architecture": arch, "file": target.name, "tensors": counts,
               "float_ffn_down": len(folded), "float_type": "F32", "rounding": ROUNDING,
               "size_mb": round(target.stat().st_size / 1e6, 3)}
    if notes:
        summary["notes"] = notes
    write_card(out, "gguf", q, summary, {**(card or {}), "notes": [*(card or {}).get("notes", []), *notes]},
               target=target)
    return summary


def _expert_tensors(name: str, tensor: torch.Tensor, grids: dict, view) -> list[tuple[str, _Rows]]:
    """A fused expert parameter → llama.cpp's stacked tensors (gate_up [E, 2I, H] → ffn_gate_exps + ffn_up_exps
    [E, I, H]; down [E, H, I] → ffn_down_exps), each expert Q4_0 where it was quantized."""
    import gguf

    block = int(name[len(view.layers_path) + 1:].split(".", 1)[0])
    param = name.rsplit(".", 1)[1]
    experts = tensor.shape[0]
    parts = []
    for e in range(experts):
        grid = grids.get(e)
        if grid is not None:
            parts.append(_Rows(grid.codes.numpy(), _block_scales(grid)))
        else:
            parts.append(_Rows(value=tensor[e].detach().float().cpu().numpy()))
    if any(p.codes is None for p in parts) and any(p.codes is not None for p in parts):
        parts = [_Rows(value=p.dequantized()) if p.codes is not None else p for p in parts]
    stacked = _Rows.stack(parts)

    def named(kind) -> str:
        return gguf.TENSOR_NAMES[kind].format(bid=block) + ".weight"

    if param == "down_proj":
        return [(named(gguf.MODEL_TENSOR.FFN_DOWN_EXP), stacked)]
    half = tensor.shape[1] // 2
    return [(named(gguf.MODEL_TENSOR.FFN_GATE_EXP), stacked.map_rows(lambda r: r[:, :half])),
            (named(gguf.MODEL_TENSOR.FFN_UP_EXP), stacked.map_rows(lambda r: r[:, half:]))]


def _tokenizer_kind(spec: dict) -> str:
    """"bpe" (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM), "spm" (SentencePiece-style BPE over '▁' with byte
    fallback: Llama 2, Gemma), or one BadInputError line."""
    model = spec.get("model", {})
    text = json.dumps({k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")}, ensure_ascii=False)
    if model.get("type") != "BPE":
        raise BadInputError(f"GGUF export writes BPE vocabularies (byte-level or SentencePiece-style); this tokenizer "
                            f"is {model.get('type')}", "use the packed or compressed-tensors export")
    if '"ByteLevel"' in text:
        return "bpe"
    if model.get("byte_fallback") and "▁" in text:
        return "spm"
    raise BadInputError("GGUF export writes byte-level BPE or SentencePiece-style ('▁', byte-fallback) vocabularies; "
                        "this BPE tokenizer is neither", "use the packed or compressed-tensors export")


# byte-level BPE pre-tokenisation → the name llama.cpp gives its regex (llama.cpp splits text by name, not by regex);
# the Split regexes as tokenizer.json files hold them (llama.cpp's src/llama-vocab.cpp quotes them)
BPE_PRE_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",  # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",  # Qwen 2/2.5/3
}


def _bpe_pre(pre: dict) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer's pre_tokenizer, or one BadInputError line."""
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    splits = [p.get("pattern", {}).get("Regex") for p in parts if p.get("type") == "Split"]
    byte_level = next((p for p in parts if p.get("type") == "ByteLevel"), {})
    digits = any(p.get("type") == "Digits" and p.get("individual_digits") for p in parts)
    if kinds == ["ByteLevel"] and byte_level.get("use_regex", True):
        return "gpt-2"  # GPT-2's own regex
    if set(kinds) == {"Digits", "ByteLevel"} and digits and byte_level.get("use_regex", True):
        return "smollm"  # SmolLM / StarCoder: digits one by one, then GPT-2's regex
    if len(splits) == 1 and kinds == ["Split", "ByteLevel"] and splits[0] in BPE_PRE_SPLITS \
            and not byte_level.get("use_regex", True):
        return BPE_PRE_SPLITS[splits[0]]
    raise BadInputError(f"GGUF export: the tokenizer's pre-tokenizer ({', '.join(str(k) for k in kinds)}"
                        f"{f', regex {splits[0]!r}' if splits else ''}) is not one this writer maps to llama.cpp's "
                        "named pre-tokenizers (gpt-2, smollm, llama-bpe, qwen2); llama.cpp would split text "
                        "differently", "use the packed or compressed-tensors export")


def _tokenizer_metadata(writer, tokenizer, vocab_size: int) -> None:
    """The vocabulary as llama.cpp tokenizes it: byte-level BPE as tokenizer model "gpt2" (tokens, types, merges,
    the pre-tokenizer by name), SentencePiece-style BPE as "llama" (tokens, types, and scores that order merges as
    the BPE merge ranks do: the token a merge of rank r produces scores −r; byte tokens <0xXX> typed BYTE)."""
    import gguf

    from toolkit.models.tokens import bos_id

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise BadInputError("GGUF export needs a fast (tokenizers) BPE tokenizer")
    spec = json.loads(backend.to_str())
    kind = _tokenizer_kind(spec)
    model = spec["model"]
    vocab = dict(model["vocab"])
    special = {}
    for added in spec.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        special[added["id"]] = bool(added.get("special"))
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [int(gguf.TokenType.UNUSED)] * size
    for text, index in vocab.items():
        tokens[index] = text
        types[index] = int(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if kind == "spm":
        produced: dict[str, float] = {}
        for rank, merge in enumerate(model.get("merges", [])):
            a, b = merge if not isinstance(merge, str) else merge.split(" ", 1)
            produced.setdefault(a + b, -float(rank))
        scores = [-1e9] * size  # a multi-character token no merge produces is never a merge result
        for text, index in vocab.items():
            scores[index] = produced.get(text, 0.0 if len(text) == 1 else -1e9)
            if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                types[index], scores[index] = int(gguf.TokenType.BYTE), 0.0
    for index, is_special in special.items():
        types[index] = int(gguf.TokenType.CONTROL if is_special else gguf.TokenType.USER_DEFINED)
    if kind == "spm" and model.get("unk_token") in vocab:
        types[vocab[model["unk_token"]]] = int(gguf.TokenType.UNKNOWN)
    if kind == "bpe":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(_bpe_pre(spec.get("pre_tokenizer") or {}))
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
    else:
        rules = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")], ensure_ascii=False)
        prefix = '"Prepend"' in rules or ('"Metaspace"' in rules and '"prepend_scheme": "never"' not in rules
                                          and '"add_prefix_space": false' not in rules)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_add_space_prefix(prefix)
    for name, value in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                        ("unk", tokenizer.unk_token_id), ("pad", tokenizer.pad_token_id)):
        if value is not None:
            getattr(writer, f"add_{name}_token_id")(int(value))
    writer.add_add_bos_token(bos_id(tokenizer) is not None)  # as the tokenizer encodes text (BOS first or not)
    writer.add_add_eos_token(False)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)


def read_q4_0(path: Path) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """A GGUF file as written: (metadata {key: value}, {name: (codes int8 [..., cols] in [−8, 7], d float16
    [..., cols/32])} for Q4_0 tensors, {name: float32 array} for the others), shapes in (rows, cols) order."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        metadata[key] = value
    grids, floats = {}, {}
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_0:
            raw = np.asarray(t.data, dtype=np.uint8).reshape(*shape[:-1], shape[-1] // BLOCK, 18)
            d = raw[..., :2].copy().view(np.float16)[..., 0]
            qs = raw[..., 2:]
            codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8
            grids[t.name] = (codes.reshape(shape), d)
        else:
            floats[t.name] = np.asarray(t.data, dtype=np.float32).reshape(shape)
    return metadata, grids, floats


def read_gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """{gguf tensor name: dequantized float32 array in (rows, cols) order} via gguf.GGUFReader (for checks)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        tuple(int(s) for s in reversed(t.shape))) for t in reader.tensors}
