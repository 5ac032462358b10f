"""run() and the --dry-run plan for `iclrkit eval ppl`."""

from __future__ import annotations

from toolkit.eval.config import PerplexityConfig


def run_perplexity(config: PerplexityConfig, ctx) -> dict:
    from toolkit.data.text import load_text, split_text, tokenize
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.tokens import bos_id

    if config.data is None:  # scoring the embedded text is a default the user did not choose: say so
        ctx.warn("no --data given: scoring the embedded sample text (Python's documentation); pass --data FILE")
    text = load_text(config.data)
    model, lazy, tokenizer = _load(config, ctx)
    if config.split:
        text = split_text(text, test_fraction=0.05, seed=0)[config.split == "test"]
    ids = tokenize(tokenizer, text)
    bos = bos_id(tokenizer)  # the tokenizer's convention: windows start with BOS where it adds one
    max_length, stride = clamp_windows(config.max_length, config.stride, _context(model.config, config.max_length),
                                       ctx.warn)
    if lazy is not None:
        from toolkit.eval.onloaded import perplexity_onloaded

        result = perplexity_onloaded(lazy, ids, max_length=max_length, stride=stride, device=ctx.device,
                                     max_windows=config.max_windows, progress=ctx.progress, bos=bos)
        result["onload"] = True
    else:
        result = perplexity(model, ids, max_length=max_length, stride=stride, device=ctx.device,
                            max_windows=config.max_windows, progress=ctx.progress, bos=bos)
    ctx.inputs["model"] = config.model
    result["bos"] = bos is not None
    ctx.metrics.update(result)
    return result


def clamp_windows(max_length: int, stride: int | None, context: int, warn) -> tuple[int, int | None]:
    """(window length, stride) for a model of `context` tokens: a longer --max-length is clamped to the context and
    a given --stride scaled with it (the same share of each window is new tokens, e.g. 1024/512 -> 256/128 on a
    256-token model); each clamp is said (and recorded in run.json's warnings), never silent."""
    if max_length <= context:
        return max_length, stride
    warn(f"--max-length {max_length} clamped to {context}, the model's context length")
    if stride is None:
        return context, None
    scaled = max(1, min(context, stride * context // max_length))
    warn(f"--stride {stride} scaled to {scaled} with it (the same stride/max-length ratio)")
    return context, scaled


def _load(config: PerplexityConfig, ctx):
    """(model, LazyModel or None, tokenizer): with onload=true the model is a meta skeleton whose blocks are read
    from the safetensors shards one at a time (toolkit/models/lazy.py); otherwise the whole model is loaded."""
    if not config.onload:
        from toolkit.models.source import load_model

        model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
        return model, None, tokenizer
    import torch

    from toolkit.models.lazy import LazyModel, onload_source
    from toolkit.models.source import load_tokenizer

    lazy = LazyModel(onload_source(config.model), dtype=ctx.torch_dtype or torch.float32)
    return lazy.model, lazy, load_tokenizer(config.model)


def _context(model_config, default: int) -> int:
    return getattr(model_config, "max_position_embeddings", None) or getattr(model_config, "n_positions", default)


def plan_perplexity(config: PerplexityConfig, ctx) -> dict:
    """--dry-run: from a local model's config.json alone (no weight read, nothing built), the memory: the whole
    model resident, or with onload=true the parts outside the blocks + one block + every window's hidden states."""
    from pathlib import Path

    import torch

    from toolkit.models.memory import plan_memory

    source = Path(config.model).expanduser()
    if not (source / "config.json").is_file():
        return {"onload": config.onload, "memory": "not planned: --model is not a local directory with config.json"}
    if config.onload:
        from toolkit.models.lazy import onload_source

        onload_source(config.model)
    windows = config.max_windows or 1
    memory = plan_memory(source, nsamples=windows, seqlen=config.max_length, device=ctx.device,
                         onload=config.onload, compute_dtype=ctx.torch_dtype or torch.float32,
                         hessian_copies=0, weight_copies=0)
    for part in ("bytes", "mb"):
        for key in ("output", "hessians", "solve_weights"):
            memory[part].pop(key, None)
    return {"onload": config.onload, "blocks": memory["blocks"], "max_length": config.max_length,
            "windows_planned": windows if config.max_windows else
            "1 (--max-windows not given: activations grow by one window's hidden states per window)",
            "memory": memory}
