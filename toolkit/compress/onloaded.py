"""compress with onload=true: per-block onloading from a local safetensors directory (toolkit/models/lazy.py) — the
memory plan from config.json alone, and the run that reads, compresses and writes one block at a time."""

from __future__ import annotations

from toolkit.core.timing import Stopwatch


def onload_source(config):
    from toolkit.core.errors import BadInputError
    from toolkit.models.lazy import onload_source as model_source

    source = model_source(config.model)
    if config.rotate:
        raise BadInputError("rotate=true needs the whole model in memory; onload=true compresses unrotated",
                            "set rotate=false with onload=true")
    if config.embed_bits < 16:
        raise BadInputError("embed_bits < 16 is not available with onload=true", "keep embed_bits=16")
    return source


def plan_onloaded(config, ctx) -> dict:
    """--dry-run with onload=true: the memory plan from config.json alone (no weight is read)."""
    import torch

    from toolkit.models.memory import plan_memory

    source = onload_source(config)
    memory = plan_memory(source, nsamples=config.nsamples, seqlen=config.seqlen, device=ctx.device,
                         compute_dtype=ctx.torch_dtype or torch.float32,
                         hessian_dtype=getattr(torch, config.solve_dtype), batched=_batched(config, source))
    return {"method": config.method, "onload": True, "blocks": memory["blocks"], "memory": memory,
            "not_available_with_onload": ["rotation", "perplexity eval (run `iclrkit eval ppl --set onload=true` on "
                                          "the output)", "packed export", "--resume"]}


def _batched(config, source) -> bool:
    from toolkit.models.memory import block_dims, skeleton
    from toolkit.models.view import view_of

    return config.fused_calibration_fits(config.nsamples, config.seqlen, block_dims(view_of(skeleton(source))))


def run_compress_onloaded(config, ctx, calibration, compress_all) -> dict:
    """compress with one block in memory: the blocks are read from the shards, compressed with the same on_block as
    the resident path and written to <out>/model as they finish (dense fake-quant export). `calibration` and
    `compress_all` are the recipe's own (toolkit.compress.recipe passes them: this module never imports it)."""
    import torch

    from toolkit.compress.outputs import finish_onloaded_export
    from toolkit.core.context import warn_and_record
    from toolkit.models.lazy import LazyModel
    from toolkit.models.source import load_tokenizer
    from toolkit.nn.distributed import dist_info, ranks_metric

    source = onload_source(config)
    if config.rotate is None:
        warn_and_record("onload=true compresses unrotated (rotation needs the whole model)")
    if config.eval_data:
        warn_and_record("onload=true skips the perplexity eval (it needs the whole model): run `iclrkit eval ppl "
                        "--set onload=true` on <out>/model")
    if config.export in ("both", "packed"):
        warn_and_record("onload=true writes the dense export only (packed export needs the whole model)")
    lazy = LazyModel(source, dtype=ctx.torch_dtype or torch.float32)
    tokenizer = load_tokenizer(config.model)
    ctx.inputs["model"] = config.model
    windows = calibration(config, tokenizer, lazy.model, ctx.seed, ctx)
    out_dir = ctx.path("model") if ctx.out is not None and config.export != "none" and dist_info()[0] == 0 else None
    summary: dict = {}
    with Stopwatch() as watch:
        _, kept, _ = compress_all(lazy.view, windows, config, ctx, lazy=lazy, out_dir=out_dir, summary=summary)
    per_block = summary.get("seconds_per_block", [])
    ctx.metrics.update({"method": config.method, "compress_seconds": round(watch.seconds, 3),
                        "compress_cpu_seconds": round(watch.cpu_seconds, 3), "rotated": False,
                        "onload": True, "linears": sum(len(lazy.view.known_layout(i).slots) for i in range(len(lazy.layers))),
                        "sparsity": round(kept, 4), "calibration_windows": int(windows.shape[0]),
                        "seqlen": int(windows.shape[1]), "seconds_per_block": [round(t, 3) for t in per_block],
                        "cpu_seconds_per_block": [round(t, 3) for t in summary.get("cpu_seconds_per_block", [])],
                        **ranks_metric()})
    if out_dir is not None:
        finish_onloaded_export(config, source, out_dir, lazy.dtype)
    return ctx.metrics
