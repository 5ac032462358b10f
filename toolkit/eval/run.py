"""run() for `iclrkit eval ppl`."""

from __future__ import annotations

from toolkit.eval.config import PerplexityConfig


def run_perplexity(config: PerplexityConfig, ctx) -> dict:
    from toolkit.data.text import load_text, split_text, tokenize
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.source import load_model

    if config.data is None:  # scoring the embedded text is a default the user did not choose: say so
        ctx.warn("no --data given: scoring the embedded sample text (Python's documentation); pass --data FILE")
    text = load_text(config.data)
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    if config.split:
        text = split_text(text, test_fraction=0.05, seed=0)[config.split == "test"]
    ids = tokenize(tokenizer, text)
    max_length = min(config.max_length, getattr(model.config, "max_position_embeddings", None)
                     or getattr(model.config, "n_positions", config.max_length))
    if max_length < config.max_length:  # a silent clamp otherwise: say it, and run.json records it under warnings
        ctx.warn(f"--max-length {config.max_length} clamped to {max_length}, the model's context length")
    result = perplexity(model, ids, max_length=max_length, stride=config.stride, device=ctx.device,
                        max_windows=config.max_windows, progress=ctx.progress)
    ctx.inputs["model"] = config.model
    ctx.metrics.update(result)
    return result
