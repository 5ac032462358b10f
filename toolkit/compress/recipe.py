"""The shared compression recipe: load → (rotate) → calibrate layer by layer with sequential groups
[q,k,v] → [o] → [gate,up] → [down] → compress each linear with the chosen method → evaluate with fake-quantized
activations and KV cache → export (dense fake-quant HF model and/or packed INT4 + bitmask: toolkit.compress.outputs)."""

from __future__ import annotations

import hashlib
import json
import logging

from toolkit.compress.blocks import G_IDX, BlockCompressor
from toolkit.compress.config import CompressConfig, resolve_defaults
from toolkit.compress.stages import transforms
from toolkit.core.registry import registry
from toolkit.core.timing import Stopwatch

log = logging.getLogger("iclrkit")


def fingerprint(config: CompressConfig) -> str:
    payload = config.model_dump(mode="json")
    for key in ("eval_data", "eval_max_length", "eval_windows", "export"):
        payload.pop(key, None)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _run_fingerprint(config: CompressConfig, model) -> str:
    """The config's fingerprint, plus the model dtype when it is not float32 (a resumed run keeps its dtype)."""
    import torch

    dtype = next(model.parameters()).dtype
    return fingerprint(config) + ("" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}")


def compress_linear(W, hessian_raw, config: CompressConfig, percdamp: float):
    """(Ŵ, kept mask, WeightGrid or None) for one linear's weight W (out × in) and its raw Hessian, by the method
    registered under `config.method` (toolkit/compress/methods/)."""
    from toolkit.compress.job import LinearJob
    from toolkit.compress.solvers import damp_hessian

    method = registry("compress").get(config.method)
    hessian = damp_hessian(hessian_raw, percdamp) if _meta(method, "needs_hessian", config) else None
    return method.obj(LinearJob(W, hessian_raw, hessian, config))


def _meta(entry, key: str, config) -> bool:
    """A method's metadata flag; a recipe's depends on its stages (registered as a function of the config)."""
    value = entry.meta.get(key)
    return bool(value(config) if callable(value) else value)


def _resolve_rotate(config: CompressConfig, view, ctx=None) -> bool:
    """Whether this run rotates: `rotate=true` on an architecture where the rotation is not exact is bad input with
    the reason; the default (None) rotates where it is exact and says why not elsewhere (stderr and run.json)."""
    from toolkit.compress.rotation import rotation_refusal

    if config.rotate is False:
        return False
    reason = rotation_refusal(view, a_bits=config.a_bits)
    if reason is None:
        return True
    if config.rotate:
        from toolkit.core.errors import BadInputError

        raise BadInputError(f"rotation is not exact for {view.model_type}: {reason}", "run with --no-rotate")
    message = f"rotation skipped: not exact for {view.model_type} ({reason}); quantizing unrotated"
    if ctx is not None:
        ctx.warn(message)
    else:
        log.warning(message)
    return False


def _calibration(config, tokenizer, model, seed, ctx=None):
    from toolkit.data.text import calibration_windows, load_text

    seqlen = min(config.seqlen, _context(model, config.seqlen))
    if seqlen < config.seqlen and ctx is not None:  # a silent clamp otherwise: run.json records it under warnings
        ctx.warn(f"--seqlen {config.seqlen} clamped to {seqlen}, the model's context length")
    if config.data is None and ctx is not None:
        ctx.warn("no --data given: calibrating on the embedded sample text (Python's documentation); pass --data")
    if ctx is not None:
        from toolkit.models.tokens import bos_id

        ctx.metrics["bos"] = bos_id(tokenizer) is not None  # calibration (and eval) windows start with BOS
    return calibration_windows(tokenizer, load_text(config.data), config.nsamples, seqlen, seed)


def _context(model, default: int) -> int:
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", default)


def plan(config: CompressConfig, ctx) -> dict:
    """--dry-run: the architecture as discovered, the linears that would be compressed, their Hessian sizes, and a
    memory estimate."""
    from toolkit.models.source import load_model
    from toolkit.models.view import view_of

    if config.onload:
        from toolkit.compress.onloaded import plan_onloaded

        return plan_onloaded(config, ctx)
    model, _ = load_model(config.model, "cpu", None, with_tokenizer=False)
    view = view_of(model)
    rotate = _resolve_rotate(config, view)
    layout, block = view.layout(0), view.blocks[0]
    linears, hessian_bytes = [], 0
    width = 4 if config.solve_dtype == "float32" else 8
    for group in layout.groups:
        for slot in group.slots[:1] if group.experts else group.slots:
            out_f, in_f = slot.shape(block)
            name = f"{slot.module}.{slot.param}[0..{len(group.slots) - 1}]" if group.experts else slot.name
            linears.append({"linear": name, "shape": [out_f, in_f], "hessian": [in_f, in_f]})
            copies = len(group.slots) if group.experts else 1  # one Hessian per expert, all held at once
            hessian_bytes = max(hessian_bytes, copies * in_f * in_f * width)
    params = sum(p.numel() for p in model.parameters())
    seqlen = min(config.seqlen, _context(model, config.seqlen))
    activations = 2 * config.nsamples * seqlen * view.dims()["hidden"] * 4
    return {"method": config.method, "blocks": len(view), "architecture": view.describe(),
            "linears_per_block": linears, "rotate": rotate,
            "sequential_groups": [g.names for g in layout.groups], "calibration_tokens": config.nsamples * seqlen,
            "memory_estimate_mb": round((params * 4 + activations + 3 * hessian_bytes) / 2**20, 1),
            "largest_hessian_mb": round(hessian_bytes / 2**20, 2), **_stage_plan(config)}


def _stage_plan(config) -> dict:
    """A recipe's resolved stages, in order, for --dry-run (methods: nothing)."""
    from toolkit.compress.stages import of

    if not getattr(config, "stages", None):
        return {}
    return {"stages": [{"stage": s.name, "role": s.role, "knobs": s.knobs} for s in of(config)]}


def run_compress(config: CompressConfig, ctx) -> dict:
    from toolkit.compress.outputs import export_outputs
    from toolkit.models.source import load_model
    from toolkit.models.view import view_of
    from toolkit.nn.distributed import dist_info, ranks_metric

    if ctx.resume and ranks_metric():
        from toolkit.core.errors import BadInputError

        raise BadInputError("--resume continues a one-process run; it cannot be split across torchrun ranks",
                            "resume without torchrun, or start afresh without --resume")
    if config.onload:
        from toolkit.compress.onloaded import run_compress_onloaded

        return run_compress_onloaded(resolve_defaults(config, False, ctx), ctx, _calibration, _compress_all)

    _check_export_before_loading(config)
    # the model (and its forwards) in --dtype; Hessians and solves in solve_dtype; weights written back in --dtype
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    view = view_of(model)  # resolved once; every step below asks it
    ctx.inputs["model"] = config.model
    _check_activation_bits(config, view)
    rotate = _resolve_rotate(config, view, ctx)
    config = resolve_defaults(config, rotate, ctx)
    windows = _calibration(config, tokenizer, model, ctx.seed, ctx)
    view.layout(0)  # probed on the unrotated model (the rotation keeps the structure)
    rotation = None
    with Stopwatch() as watch:
        for stage in transforms(config, rotate):  # whole-model stages (rotate, a recipe's smooth) before the blocks
            rotation = stage.transform(view, windows, config, ctx).get("rotation", rotation)
        scales, kept, g_idx = _compress_all(view, windows, config, ctx)
        vocab_grids = None
        if config.embed_bits < 16:
            from toolkit.compress.packed import round_vocab_matrices

            vocab_grids = round_vocab_matrices(view, config.embed_bits, config.embed_group)
    _record(ctx, config, watch, rotate, len(view.slot_names()), kept, windows)
    if dist_info()[0] > 0:  # under torchrun every rank holds the same compressed model: rank 0 evaluates and writes
        return ctx.metrics
    if config.eval_data:
        _evaluate(view, tokenizer, config, ctx, rotate)
    export_outputs(view, tokenizer, config, ctx, scales, rotation, vocab_grids, g_idx)
    return ctx.metrics


def _record(ctx, config, watch, rotate: bool, linears: int, kept: float, windows) -> None:
    from toolkit.nn.distributed import ranks_metric

    ctx.metrics.update({"method": config.method, "compress_seconds": round(watch.seconds, 3),
                        "compress_cpu_seconds": round(watch.cpu_seconds, 3), "rotated": rotate, "linears": linears,
                        "sparsity": round(kept, 4), "calibration_windows": int(windows.shape[0]),
                        "seqlen": int(windows.shape[1]), **ranks_metric()})


def _check_activation_bits(config, view) -> None:
    if config.a_bits < 16 and view.layout(0).experts is not None:
        from toolkit.core.errors import BadInputError

        raise BadInputError(f"--a-bits {config.a_bits}: {view.model_type}'s fused experts compute their inputs inside "
                            "one forward, where activations cannot be fake-quantized", "keep --a-bits 16 on MoE models")


def _check_export_before_loading(config) -> None:
    """An export the architecture cannot have is refused from config.json, before the model loads (a GGUF request on
    a model this writer does not lay out used to fail after the whole run)."""
    if config.export != "gguf":
        return
    from transformers import AutoConfig

    from toolkit.export.gguf import check_architecture
    from toolkit.models.source import resolve_model_path

    try:
        model_config = AutoConfig.from_pretrained(str(resolve_model_path(config.model)))
    except (OSError, ValueError):
        return  # the loader says what is wrong with the model itself
    check_architecture(model_config)  # the architecture and the conventions llama.cpp hard-codes for it


def _evaluate(view, tokenizer, config, ctx, rotate: bool) -> None:
    """Perplexity of the compressed model with its activations and KV cache fake-quantized as configured."""
    from toolkit.compress.quant import activation_quant, kv_cache_quant
    from toolkit.data.text import load_text, tokenize
    from toolkit.eval.perplexity import perplexity

    model = view.model
    from toolkit.models.tokens import bos_id

    ids = tokenize(tokenizer, load_text(config.eval_data))
    attention = [view.attention(i) for i in range(len(view))]
    with activation_quant(model, view.quantized_inputs(), config.a_bits, config.a_clip_ratio), \
            kv_cache_quant(model, attention, config.kv_bits, config.kv_bits, hadamard=rotate, mode=config.kv_quant):
        result = perplexity(model, ids, max_length=min(config.eval_max_length, _context(model, 2048)),
                            device=ctx.device, max_windows=config.eval_windows, progress=ctx.progress,
                            bos=bos_id(tokenizer))
    ctx.metrics.update({"ppl": result["ppl"], "eval_tokens": result["tokens"],
                        "eval_simulated": "fake-quant activations/KV on CPU" if config.a_bits < 16
                        or config.kv_bits < 16 else "weights only"})


def _compress_all(view, windows, config, ctx, lazy=None, out_dir=None, summary=None):
    """Run the sequential pipeline; returns ({slot name: scales [out] or [out, groups]}, achieved sparsity over
    block slots, {slot name: g_idx} for activation-ordered groups)."""
    from safetensors.torch import load_file

    from toolkit.nn.distributed import dist_info
    from toolkit.nn.pipeline import run_sequential

    compressor = BlockCompressor(view, windows, config, ctx, lambda *args: _solve_group(*args))
    checkpoints = ctx.checkpoint_dir if ctx.out is not None and dist_info()[0] == 0 else None
    ctx.metrics["calibration"] = compressor.mode()
    if lazy is not None:  # onloaded: blocks read, compressed, counted and written one at a time
        from toolkit.nn.pipeline import run_sequential_onloaded

        def counted(step):
            compressor.on_block(step, checkpoints)
            compressor.count(step.block, step.layout)

        (summary if summary is not None else {}).update(run_sequential_onloaded(
            lazy, windows, counted, device=ctx.device, out_dir=out_dir, progress=ctx.progress))
    else:
        run_sequential(view.model, windows, lambda step: compressor.on_block(step, checkpoints), device=ctx.device,
                       checkpoint_dir=checkpoints, resume=ctx.resume, fingerprint=_run_fingerprint(config, view.model),
                       progress=ctx.progress, view=view)
        for index, block in enumerate(view.blocks):
            compressor.count(block, view.layout(index))
    scales = compressor.scales
    if checkpoints is not None:
        for path in sorted(checkpoints.glob("scales_*.safetensors")):
            for name, value in load_file(str(path)).items():
                scales.setdefault(name, value)
    g_idx = {name[:-len(G_IDX)]: scales.pop(name).long() for name in [n for n in scales if n.endswith(G_IDX)]}
    counts = compressor.counts
    return scales, 1 - counts["kept"] / max(counts["total"], 1), g_idx


def _solve_group(weights, H, config, dtype) -> list:
    """[(Ŵ, grid)] for the linears of one sequential group (they share the input, so H). GPTQ is row by row given H,
    so for methods registered with `stack_rows` (GPTQ) the group's weights are stacked by rows and solved in one column loop (one damped Cholesky, one
    H⁻¹ factor, a third of the loop iterations for q/k/v), then split back; the other methods choose masks over
    whole blocks of a linear (SparseGPT, the two-stage baseline) and run one linear at a time.

    Under torch.distributed the solves are shared out (`share_out`: linear j on rank j mod world, results
    broadcast), so every rank ends with the same weights and grids; one process solves them all."""
    import torch

    from toolkit.nn.distributed import share_out

    def solve(w):
        new, _, grid = compress_linear(w, H, config, config.percdamp)
        return new, *(_grid_parts(grid))

    if not _meta(registry("compress").get(config.method), "stack_rows", config) or len(weights) == 1:
        solved = share_out([lambda w=w: solve(w.to(dtype)) for w in weights])
        return [(new, _grid_of(*parts)) for new, *parts in solved]
    rows = [weight.shape[0] for weight in weights]
    (new, *parts), = share_out([lambda: solve(torch.cat([weight.to(dtype) for weight in weights]))])
    grid = _grid_of(*parts)
    if grid is None:
        return [(part, None) for part in new.split(rows)]
    return [(part, _grid_of(scales, grid.group_size, grid.g_idx))
            for part, scales in zip(new.split(rows), grid.scales.split(rows))]


def _grid_parts(grid) -> tuple:
    """A WeightGrid (or None) as plain parts that `share_out` broadcasts: (scales, group_size, g_idx)."""
    return (None, None, None) if grid is None else (grid.scales, grid.group_size, grid.g_idx)


def _grid_of(scales, group_size, g_idx):
    from toolkit.compress.quant import WeightGrid

    return None if scales is None else WeightGrid(scales, group_size, g_idx)
