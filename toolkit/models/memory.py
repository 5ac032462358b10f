"""Memory plans from config.json alone (the skeleton is built on the meta device, no weight is read), and a
measure of the tensor bytes alive to check them against.

The onloaded layer pipeline (toolkit/nn/pipeline.py `run_sequential_onloaded`) holds, at its peak, the parts
outside the blocks, one block, the calibration inputs of that block and either the Hessian work of one linear
group (calibration + solve) or the block's outputs (propagation):

    peak = resident + block + inputs + max(hessians + solve_weights, outputs) + workspace

with inputs = outputs = nsamples × seqlen × hidden × bytes; hessians = copies × (largest in_features)² × bytes:
GPTQ with activation ordering (the compress default) holds 8 at once (the accumulator, the damped H and its
Cholesky factor, the permuted H and its factor, H⁻¹ and its factor U, one temporary); solve_weights = copies ×
the largest linear's weight (its solve-dtype copy, the permuted copy, the working copy, the result: 5); workspace
one window's forward through a block (the MLP's intermediate activations and the attention scores), or every
window's at once when compress runs its fused calibration (all windows through the block as one batch). Without
onloading, resident is the whole model. On an accelerator the inputs and outputs stay in host memory and one
window at a time moves.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError

MB = 2**20
# the most a fused calibration forward (every window through a block as one batch) may take in workspace; above it
# compress calibrates one window at a time (CompressConfig.fused_calibration_fits)
FUSED_WORKSPACE_LIMIT = 2**30


def batched_workspace(windows: int, seqlen: int, hidden: int, intermediate: int, heads: int, width: int) -> int:
    """Bytes of `windows` windows' forward through a block as one batch: the MLP's and the residual stream's
    activations scale with the batch, the attention scores do not (torch's scaled-dot-product attention does not
    hold a batch's [heads, seq, seq] scores at once: measured on the scale benchmark's 135M/360M/1.1B shapes, the
    batched peak is within 25% of this, and the plan was 1.3x over when the scores were counted for every window)."""
    return windows * seqlen * (3 * intermediate + 4 * hidden) * width + heads * seqlen * seqlen * width


def block_dims(view) -> tuple[int, int, int]:
    """(hidden, intermediate, heads) of the model's first block, from its slots' shapes (meta weights do)."""
    dims = view.dims()
    return dims["hidden"], dims["intermediate"], dims["heads"] or 1


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def skeleton(config_or_dir):
    """The model on the meta device (parameters only; buffers are real and small) from a config or its directory."""
    import transformers
    from accelerate import init_empty_weights

    from toolkit.models.source import _quiet_transformers

    _quiet_transformers()
    if isinstance(config_or_dir, (str, Path)):
        path = Path(config_or_dir)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise BadInputError(f"no config.json at {path}")
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise BadInputError(f"{path} is not valid JSON: {exc}") from None
        if "model_type" not in data:
            raise BadInputError(f"{path} has no model_type")
        config = transformers.AutoConfig.for_model(**data)
    elif isinstance(config_or_dir, dict):
        config = transformers.AutoConfig.for_model(**config_or_dir)
    else:
        config = config_or_dir
    with init_empty_weights(include_buffers=False):
        return transformers.AutoModelForCausalLM.from_config(config)


def plan_memory(config_or_dir, *, nsamples: int, seqlen: int, device: str = "cpu", onload: bool = True,
                compute_dtype: torch.dtype = torch.float32, hessian_dtype: torch.dtype = torch.float32,
                hessian_copies: int = 8, weight_copies: int = 5, save_dtype: torch.dtype | None = None,
                runtime_bytes: int = 0, batched: bool = False) -> dict:
    """Bytes per part and the planned peak per device (`cpu`, or `host` + the accelerator) for calibrating and
    compressing layer by layer; `runtime_bytes` (the process before any tensor: interpreter, torch, kernels) is
    added to the host peak when given (a benchmark measures it). `batched`: the calibration forward takes every
    window at once (compress's fused calibration), so the workspace is nsamples windows'."""
    from toolkit.models.view import view_of

    model = skeleton(config_or_dir)
    view = view_of(model)
    width = _bytes(compute_dtype)
    total, resident = _parameter_counts(view)
    block = max(sum(p.numel() for p in layer.parameters()) for layer in view.blocks)
    hidden, intermediate, heads = block_dims(view)
    largest_in, largest_weight, hessian_elements = _solve_sizes(view, hessian_copies)
    parts = {
        "resident_weights": (resident if onload else total) * width,
        "block_weights": block * width,
        "activations": nsamples * seqlen * hidden * width,  # the inputs of one block; its outputs as many again
        "hessians": hessian_elements * _bytes(hessian_dtype),
        "solve_weights": weight_copies * largest_weight * _bytes(hessian_dtype),
        "workspace": batched_workspace(nsamples if batched else 1, seqlen, hidden, intermediate, heads, width),
        "output": total * _bytes(save_dtype or compute_dtype),
    }
    devices = _peaks(parts, onload, device, seqlen * hidden * width, runtime_bytes)
    return {"model_type": model.config.model_type, "blocks": len(view), "parameters": total, "hidden": hidden,
            "experts": view.dims()["experts"], "largest_in_features": largest_in, "nsamples": nsamples,
            "seqlen": seqlen, "onload": onload, "batched": batched, "bytes": parts, "runtime_bytes": runtime_bytes,
            "peak_bytes": devices, "mb": {k: round(v / MB, 2) for k, v in parts.items()},
            "peak_mb": {k: round(v / MB, 2) for k, v in devices.items()}}


def _parameter_counts(view) -> tuple[int, int]:
    """(all parameters, those outside the blocks), tied ones once (the skeleton leaves the tie to loading)."""
    model = view.model
    seen, total, resident, block_ids = set(), 0, 0, {id(p) for p in view.blocks.parameters()}
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
        if id(param) not in block_ids:
            resident += param.numel()
    head, embed = view.lm_head, view.embed_tokens
    if getattr(model.config, "tie_word_embeddings", False) and head is not None and embed is not None \
            and head.weight is not embed.weight:
        resident -= head.weight.numel()
        total -= head.weight.numel()
    return total, resident


def _solve_sizes(view, hessian_copies: int) -> tuple[int, int, int]:
    """(largest in_features, largest weight, Hessian elements held at once): fused experts hold one Hessian per
    expert of a projection (E x in^2) beside one solve's copies."""
    from toolkit.models.layout import structural_slots

    block = view.blocks[0]
    slots, _, _ = structural_slots(block)
    shapes = [slot.shape(block) for slot in slots]
    largest_in = max(cols for _, cols in shapes)
    largest_weight = max(rows * cols for rows, cols in shapes)
    expert_ins: dict[str, int] = {}
    for slot, (_, cols) in zip(slots, shapes):
        if slot.kind == "expert":
            expert_ins[slot.param] = expert_ins.get(slot.param, 0) + cols * cols
    square = largest_in * largest_in
    elements = max([hessian_copies * square] + [total + (hessian_copies - 1) * square for total in expert_ins.values()])
    return largest_in, largest_weight, elements


def _peaks(parts: dict, onload: bool, device: str, window: int, runtime_bytes: int) -> dict:
    block_part = parts["block_weights"] if onload else 0
    solve = parts["hessians"] + parts["solve_weights"]
    if device not in ("cpu", "meta"):
        device_peak = (parts["resident_weights"] + block_part + 2 * window + max(solve, window)
                       + parts["workspace"])
        return {"host": 2 * parts["activations"] + parts["block_weights"] + runtime_bytes, device: device_peak}
    return {"cpu": parts["resident_weights"] + block_part + parts["activations"]
            + max(solve, parts["activations"]) + parts["workspace"] + runtime_bytes}


def whole_model_plan(model: str, why: str, *, compute_dtype: torch.dtype = torch.float32,
                     optimizer_states: int = 2) -> dict:
    """--dry-run of a command that needs the whole model at once (training: every block takes part in each
    backward pass): says so, and from a local config.json alone plans weights + gradients + optimizer state
    (AdamW: 2 per parameter), activations aside. Nothing is read or built for a hub id or zoo name."""
    plan: dict = {"whole_model": True, "onload": f"not available: {why}"}
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        plan["mb"] = "not planned: --model is not a local directory with config.json"
        return plan
    skeleton_model = skeleton(path)
    seen, total = set(), 0
    for param in skeleton_model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel()
    width = _bytes(compute_dtype)
    parts = {"weights": total * width, "gradients": total * width, "optimizer_states": optimizer_states * total * 4}
    plan.update(parameters=total, mb={k: round(v / MB, 2) for k, v in parts.items()},
                peak_mb_without_activations=round(sum(parts.values()) / MB, 2))
    return plan


def live_tensor_bytes() -> int:
    """Bytes of every CPU/accelerator tensor storage a Python object still references (each storage once; meta
    tensors hold none). A direct count of what is alive, unlike RSS, which allocator caching blurs."""
    import warnings

    seen, total = set(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on some lazy module proxies warns
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        try:
            if obj.device.type == "meta":
                continue
            storage = obj.untyped_storage()
        except Exception:  # noqa: BLE001 - half-built or exotic tensors: not ours to count
            continue
        key = (storage.device.type, storage.data_ptr())
        if key in seen or storage.data_ptr() == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


class PeakProbe:
    """A `probe` for run_sequential_onloaded: the largest live_tensor_bytes() above the baseline at creation."""

    def __init__(self):
        gc.collect()  # tensors already unreachable (in reference cycles: a model and its view) go before the baseline
        self.baseline = live_tensor_bytes()
        self.peak = 0
        self.where = ""

    def __call__(self, label: str) -> None:
        now = live_tensor_bytes() - self.baseline
        if now > self.peak:
            self.peak, self.where = now, label
