"""The shared compression recipe: load → (rotate) → calibrate layer by layer with sequential groups
[q,k,v] → [o] → [gate,up] → [down] → compress each linear with the chosen method → evaluate with fake-quantized
activations and KV cache → export (dense fake-quant HF model and/or packed INT4 + bitmask: toolkit.compress.outputs)."""

from __future__ import annotations

import hashlib
import json
import logging

from toolkit.compress.config import CompressConfig
from toolkit.core.registry import registry
from toolkit.core.timing import Stopwatch

log = logging.getLogger("iclrkit")
G_IDX = "::g_idx"  # checkpoint key suffix of a linear's activation-ordered group index (never a module path)


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
    hessian = damp_hessian(hessian_raw, percdamp) if method.needs_hessian else None
    return method.obj(LinearJob(W, hessian_raw, hessian, config))


def resolve_defaults(config, rotate: bool, ctx=None):
    """The rotation-dependent defaults, measured on SmolLM2 W4A16 GPTQ (examples/obr/RESULTS.md): actorder=auto →
    static unrotated, none rotated; w_clip=None → the MSE clip search rotated, min-max unrotated; w_range=auto →
    full with min-max scales, signed under the clip search. The effective values are recorded in the metrics."""
    update = {}
    if getattr(config, "actorder", None) == "auto":
        update["actorder"] = "none" if rotate else "static"
    if config.w_clip is None:
        update["w_clip"] = bool(rotate)
    if getattr(config, "w_range", None) == "auto":
        update["w_range"] = "signed" if update.get("w_clip", config.w_clip) else "full"
    config = config.model_copy(update=update)
    if ctx is not None:
        ctx.metrics.update(update)
    return config


def _resolve_rotate(config: CompressConfig, adapter) -> bool:
    from toolkit.compress.rotation import check_rotatable

    if config.rotate is False:
        return False
    try:
        check_rotatable(adapter)
    except Exception:
        if config.rotate:
            raise
        log.warning("rotation skipped: %s models are not rotatable here (LayerNorm); quantizing unrotated",
                    adapter.model_types[0])
        return False
    return True


def _calibration(config, tokenizer, model, seed, ctx=None):
    from toolkit.data.text import calibration_windows, load_text

    seqlen = min(config.seqlen, _context(model, config.seqlen))
    if seqlen < config.seqlen and ctx is not None:  # a silent clamp otherwise: run.json records it under warnings
        ctx.warn(f"--seqlen {config.seqlen} clamped to {seqlen}, the model's context length")
    if config.data is None and ctx is not None:
        ctx.warn("no --data given: calibrating on the embedded sample text (Python's documentation); pass --data")
    return calibration_windows(tokenizer, load_text(config.data), config.nsamples, seqlen, seed)


def _context(model, default: int) -> int:
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", default)


def plan(config: CompressConfig, ctx) -> dict:
    """--dry-run: the layers that would be compressed, their Hessian sizes, and a memory estimate."""
    from toolkit.models.adapters import adapter_for, get_layers, linear_weight
    from toolkit.models.source import load_model

    if config.onload:
        from toolkit.compress.onloaded import plan_onloaded

        return plan_onloaded(config, ctx)
    model, _ = load_model(config.model, "cpu", None, with_tokenizer=False)
    adapter = adapter_for(model)
    layers = get_layers(model, adapter)
    rotate = _resolve_rotate(config, adapter)
    linears, hessian_bytes = [], 0
    width = 4 if config.solve_dtype == "float32" else 8
    for path in adapter.block_linears():
        out_f, in_f = linear_weight(layers[0].get_submodule(path), adapter.conv1d).shape
        linears.append({"linear": path, "shape": [out_f, in_f], "hessian": [in_f, in_f]})
        hessian_bytes = max(hessian_bytes, in_f * in_f * width)
    params = sum(p.numel() for p in model.parameters())
    seqlen = min(config.seqlen, _context(model, config.seqlen))
    hidden = linear_weight(layers[0].get_submodule(adapter.attn_out), adapter.conv1d).shape[0]
    activations = 2 * config.nsamples * seqlen * hidden * 4
    return {"method": config.method, "blocks": len(layers), "linears_per_block": linears, "rotate": rotate,
            "sequential_groups": adapter.sequential_groups(), "calibration_tokens": config.nsamples * seqlen,
            "memory_estimate_mb": round((params * 4 + activations + 3 * hessian_bytes) / 2**20, 1),
            "largest_hessian_mb": round(hessian_bytes / 2**20, 2)}


def run_compress(config: CompressConfig, ctx) -> dict:
    from toolkit.compress.outputs import export_outputs
    from toolkit.compress.quant import activation_quant, kv_cache_quant
    from toolkit.models.adapters import ModelView, adapter_for, get_layers
    from toolkit.models.source import load_model
    from toolkit.nn.distributed import dist_info, ranks_metric

    if ctx.resume and ranks_metric():
        from toolkit.core.errors import BadInputError

        raise BadInputError("--resume continues a one-process run; it cannot be split across torchrun ranks",
                            "resume without torchrun, or start afresh without --resume")
    if config.onload:
        from toolkit.compress.onloaded import run_compress_onloaded

        return run_compress_onloaded(resolve_defaults(config, False, ctx), ctx, _calibration, _compress_all)

    # the model (and its forwards) in --dtype; Hessians and solves in solve_dtype; weights written back in --dtype
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    adapter = adapter_for(model)
    ctx.inputs["model"] = config.model
    rotate = _resolve_rotate(config, adapter)
    config = resolve_defaults(config, rotate, ctx)
    windows = _calibration(config, tokenizer, model, ctx.seed, ctx)
    rotation = None
    with Stopwatch() as watch:
        if rotate:
            from toolkit.compress.rotation import rotate_model

            rotation = rotate_model(model, adapter, config.rotation_seed, online_o_proj=config.a_bits < 16,
                                    kind=config.rotation_kind)
            ctx.metrics["hadamard"] = rotation["hadamard"]  # per rotation: "exact" | "kron-orthogonal"
        scales, kept, g_idx = _compress_all(model, adapter, windows, config, ctx)
        vocab_grids = None
        if config.embed_bits < 16:
            from toolkit.compress.packed import round_vocab_matrices

            vocab_grids = round_vocab_matrices(model, adapter, config.embed_bits, config.embed_group)
    layers = get_layers(model, adapter)
    block_linears = ModelView(model, adapter).block_linear_paths()
    ctx.metrics.update({"method": config.method, "compress_seconds": round(watch.seconds, 3),
                        "compress_cpu_seconds": round(watch.cpu_seconds, 3), "rotated": rotate,
                        "linears": len(block_linears), "sparsity": round(kept, 4),
                        "calibration_windows": int(windows.shape[0]), "seqlen": int(windows.shape[1]),
                        **ranks_metric()})
    if dist_info()[0] > 0:  # under torchrun every rank holds the same compressed model: rank 0 evaluates and writes
        return ctx.metrics
    if config.eval_data:
        from toolkit.data.text import load_text, tokenize
        from toolkit.eval.perplexity import perplexity

        ids = tokenize(tokenizer, load_text(config.eval_data))
        attention = [layer.get_submodule(adapter.attn_out.rsplit(".", 1)[0]) for layer in layers]
        with activation_quant(model, block_linears, config.a_bits, config.a_clip_ratio), \
                kv_cache_quant(model, attention, config.kv_bits, config.kv_bits, hadamard=rotate,
                               mode=config.kv_quant):
            result = perplexity(model, ids, max_length=min(config.eval_max_length, _context(model, 2048)),
                                device=ctx.device, max_windows=config.eval_windows, progress=ctx.progress)
        ctx.metrics.update({"ppl": result["ppl"], "eval_tokens": result["tokens"],
                            "eval_simulated": "fake-quant activations/KV on CPU" if config.a_bits < 16
                            or config.kv_bits < 16 else "weights only"})
    export_outputs(model, tokenizer, adapter, config, ctx, scales, rotation, vocab_grids, g_idx)
    return ctx.metrics


def _compress_all(model, adapter, windows, config, ctx, lazy=None, out_dir=None, summary=None):
    """Run the sequential pipeline; returns ({linear path: scales [out] or [out, groups]}, achieved sparsity over
    block linears, {linear path: g_idx} for activation-ordered groups)."""
    import torch
    from safetensors.torch import load_file, save_file

    from toolkit.models.adapters import layers_path, linear_weight, set_linear_weight
    from toolkit.models.memory import block_dims
    from toolkit.nn.distributed import dist_info
    from toolkit.nn.pipeline import run_sequential

    dtype = getattr(torch, config.solve_dtype)
    prefix = layers_path(model, adapter)
    scales: dict[str, torch.Tensor] = {}
    g_idx: dict[str, torch.Tensor] = {}
    counts = {"kept": 0, "total": 0}
    checkpoints = ctx.checkpoint_dir if ctx.out is not None and dist_info()[0] == 0 else None

    def reduced(accumulator):
        """H over every rank's windows under torch.distributed (sums and counts all-reduced; a no-op in one
        process)."""
        accumulator.all_reduce()
        return accumulator.H

    fused = config.fused_calibration_fits(windows.shape[0], windows.shape[1], block_dims(model, adapter))
    ctx.metrics["calibration"] = "fused" if fused else "per-group" if config.true_sequential else "one-pass"

    def compress_group(step, group, H, block_scales):
        modules = [step.block.get_submodule(path) for path in group]
        weights = [linear_weight(module, adapter.conv1d) for module in modules]
        solved = _solve_group(weights, H, config, dtype)
        for path, module, weight, (new, grid) in zip(group, modules, weights, solved):
            set_linear_weight(module, new.to(weight.dtype), adapter.conv1d)
            if grid is not None:
                name = f"{prefix}.{step.index}.{path}"
                block_scales[name] = grid.scales.float().contiguous()
                if grid.g_idx is not None:
                    block_scales[f"{name}{G_IDX}"] = grid.g_idx.to(torch.int32).contiguous()

    def on_block(step):
        block_scales = {}
        groups = adapter.sequential_groups()
        if fused:  # each group compressed as its input arrives in one batched forward, which also propagates
            step.calibrate_in_one_forward(
                [[step.block.get_submodule(path) for path in group] for group in groups],
                lambda index, accumulator: compress_group(step, groups[index], reduced(accumulator), block_scales),
                dtype)
        else:
            shared = None
            if not config.true_sequential:  # every group's H from one forward through the block as it came in
                shared = step.input_hessians([step.block.get_submodule(group[0]) for group in groups],
                                             adapter.conv1d, dtype)
            for index, group in enumerate(groups):
                accumulator = shared[index] if shared is not None else step.input_hessians(
                    [step.block.get_submodule(group[0])], adapter.conv1d, dtype)[0]
                compress_group(step, group, reduced(accumulator), block_scales)
        scales.update(block_scales)
        if checkpoints is not None and block_scales:
            save_file(block_scales, str(checkpoints / f"scales_{step.index}.safetensors"))

    if lazy is not None:  # onloaded: blocks read, compressed, counted and written one at a time
        from toolkit.nn.pipeline import run_sequential_onloaded

        def counted(step):
            on_block(step)
            for path in adapter.block_linears():
                weight = linear_weight(step.block.get_submodule(path), adapter.conv1d)
                counts["kept"] += int((weight != 0).sum())
                counts["total"] += weight.numel()

        (summary if summary is not None else {}).update(run_sequential_onloaded(
            lazy, windows, counted, device=ctx.device, out_dir=out_dir, progress=ctx.progress))
    else:
        run_sequential(model, windows, on_block, device=ctx.device, checkpoint_dir=checkpoints, resume=ctx.resume,
                       fingerprint=_run_fingerprint(config, model), progress=ctx.progress)
    if checkpoints is not None:
        for path in sorted(checkpoints.glob("scales_*.safetensors")):
            for name, value in load_file(str(path)).items():
                scales.setdefault(name, value)
    for name in [name for name in scales if name.endswith(G_IDX)]:
        g_idx[name[:-len(G_IDX)]] = scales.pop(name).long()
    layers = model.get_submodule(prefix)
    for layer in (layers if lazy is None else []):
        for path in adapter.block_linears():
            weight = linear_weight(layer.get_submodule(path), adapter.conv1d)
            counts["kept"] += int((weight != 0).sum())
            counts["total"] += weight.numel()
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

    if not registry("compress").get(config.method).meta.get("stack_rows") or len(weights) == 1:
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
