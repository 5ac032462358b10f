"""The file's metadata keys: sizes read from the model the way llama.cpp names them (`model_dims`), the keys every
architecture carries (`write_metadata`) and the extra ones a layout names (`KEY_WRITERS`), Llama-3 RoPE scaling as
rope_freqs factors, and Gemma's attention-scale ratio."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.gguf.layouts import GgufLayout, rope_sets, text_config
from toolkit.export.quantized import QuantizedModel


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
    local = rope_sets(text).get("sliding_attention", {}).get("rope_theta")
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


def model_dims(q: QuantizedModel, arch: str) -> dict:
    """Sizes read from the model (its config and the discovered block), the way llama.cpp names them."""
    view, text = q.view, text_config(q.model.config)
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
    for params in rope_sets(text).values():
        rotary = float(params.get("partial_rotary_factor", rotary))
    rotary = float(getattr(text, "partial_rotary_factor", None) or rotary)
    return {"layers": len(view), "hidden": int(d["hidden"]), "heads": heads, "kv_heads": kv, "head_dim": head_dim,
            "ff": int(expert_ff or dense_ff or 4 * d["hidden"]), "expert_ff": expert_ff,
            "shared_ff": dense_ff if expert_ff else None, "experts": int(d["experts"]),
            "rope_dims": int(rotary * head_dim)}


def rope_factors(text, head_dim: int) -> np.ndarray | None:
    """Llama-3 RoPE scaling as llama.cpp's rope_freqs divisors: default inverse frequencies over the scaled ones,
    both computed by transformers' own RoPE initialisation."""
    params = rope_sets(text).get("", {})
    if params.get("rope_type") != "llama3":
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, attention = ROPE_INIT_FUNCTIONS["llama3"](text, "cpu")
    if abs(float(attention) - 1.0) > 1e-12:
        raise BadInputError(f"llama3 RoPE with attention scaling {attention}: not written to GGUF")
    base = float(params.get("rope_theta", 10000.0))
    default = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (default / scaled.double()).float().numpy()


def query_scale(text, layout: GgufLayout, dims: dict) -> float:
    """c with llama.cpp's attention scale · c = transformers' (Gemma's query_pre_attn_scalar^-½)."""
    if layout.query_scale_27b is None or getattr(text, "query_pre_attn_scalar", None) is None:
        return 1.0
    llama_denominator = (dims["hidden"] / dims["heads"] if dims["layers"] == layout.query_scale_27b
                         else dims["head_dim"])
    return math.sqrt(llama_denominator / float(text.query_pre_attn_scalar))


def write_metadata(writer, q: QuantizedModel, arch: str, layout: GgufLayout, dims: dict) -> list[str]:
    import gguf

    text = text_config(q.model.config)
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
        sets = rope_sets(text)
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
