"""The one gate before anything is loaded: `check_architecture` maps a model type to llama.cpp's architecture and, given
a config, checks the conventions llama.cpp hard-codes for it (`CHECKS`, by name in a layout) and the RoPE variant."""

from __future__ import annotations

from toolkit.core.errors import BadInputError
from toolkit.export.gguf.layouts import LAYOUTS, REFUSED, GgufLayout, rope_sets, text_config


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
        text = text_config(config)
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


# -- config conventions llama.cpp hard-codes (None = holds) -------------------------------------------------------

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


def _rope_problems(text, layout: GgufLayout) -> list[str]:
    if not layout.rope:
        return []
    problems = []
    for kind, params in rope_sets(text).items():
        rope_type = params.get("rope_type") or params.get("type") or "default"
        allowed = ("default", "linear") + (("llama3",) if layout.rope_factors else ())
        if kind == "sliding_attention":
            allowed = ("default",)  # llama.cpp scales only the global layers' positions
        if rope_type not in allowed:
            problems.append(f"RoPE type {rope_type!r}{f' ({kind})' if kind else ''} (written: {', '.join(allowed)})")
    return problems
