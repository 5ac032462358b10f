"""One view of a weight-quantized model for every exporter: the runnable fake-quant model plus, per quantized
linear, its integer codes and scales. Built from a compress run in memory or from a `packed/` directory (checked
tensor by tensor, so a missing or corrupt tensor is one BadInputError line, not a KeyError deep in a loader).

`load_packed_model` is what `--model packed/` resolves to: the dequantized model with its online rotations and,
when the run quantized activations or the KV cache, the same fake-quant hooks the run evaluated with.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.core.registry import register

log = logging.getLogger("iclrkit")


@dataclass
class LinearGrid:
    codes: torch.Tensor  # int8 [out, in], symmetric codes in [-2^{b-1}, 2^{b-1}-1]; pruned weights are code 0
    scales: torch.Tensor  # float32 [out, groups]; groups = 1 for per-channel
    group_size: int | None = None  # None = per output channel

    def dequantized(self) -> torch.Tensor:
        scales = self.scales.float()
        if self.group_size is not None:
            scales = scales.repeat_interleave(self.group_size, dim=1)[:, :self.codes.shape[1]]
        return self.codes.float() * scales


@dataclass
class QuantizedModel:
    model: torch.nn.Module  # fake-quant model (float weights on the grid), online rotations installed
    tokenizer: object
    view: object  # toolkit.models.view.ModelView of `model`
    bits: int
    linears: dict[str, LinearGrid]
    metadata: dict = field(default_factory=dict)  # method, w_bits, a_bits, kv_bits, sparsity, nm, rotation, ...
    dense_dtype: torch.dtype | None = None  # storage dtype for unquantized tensors; None = as in the model
    provenance: dict = field(default_factory=dict)  # source model, calibration data, commands (for the card)


def is_packed_dir(path) -> bool:
    from toolkit.compress.packed import WEIGHTS

    try:
        return (Path(path) / WEIGHTS).is_file()
    except (OSError, TypeError):
        return False


def _grid(codes: torch.Tensor, scales: torch.Tensor, group_size: int | None) -> LinearGrid:
    if scales.dim() == 2 and scales.shape[1] > 1:
        if not group_size:
            raise BadInputError("grouped weight scales without a group_size in the model's metadata")
        return LinearGrid(codes, scales.float(), int(group_size))
    return LinearGrid(codes, scales.float().reshape(-1, 1), None)


def from_model(view, tokenizer, scales: dict[str, torch.Tensor], bits: int, metadata: dict,
               provenance: dict | None = None, g_idx: dict | None = None) -> QuantizedModel:
    """From a compress run in memory: `scales` maps each quantized slot (linear path, or one expert of a fused
    expert tensor) to its scales ([out] per channel, [out, groups] grouped with metadata["group_size"])."""
    from toolkit.compress.quant import codes_of

    if g_idx:
        raise BadInputError("activation-ordered groups (actorder=group, g_idx) are not exported to this format",
                            "compress with --actorder static (or none) to export")
    linears = {}
    for path, scale in scales.items():
        weight = view.weight(path).detach().cpu()
        grid = _grid(torch.zeros(0), scale.detach().cpu(), metadata.get("group_size"))
        entry = grid.scales if grid.group_size is None else \
            grid.scales.repeat_interleave(grid.group_size, dim=1)[:, :weight.shape[1]]
        codes = codes_of(weight.float(), entry, bits)
        if not torch.equal((codes * entry).to(weight.dtype), weight):
            raise BadInputError(f"{path}: weight is not on its quantization grid; cannot export it losslessly")
        grid.codes = codes.to(torch.int8)
        linears[path] = grid
    return QuantizedModel(view.model, tokenizer, view, bits, linears, dict(metadata), None, dict(provenance or {}))


def check_packed(directory) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, tensors) of a packed directory, or one BadInputError line naming the first bad tensor."""
    from toolkit.compress.packed import WEIGHTS, read_packed

    directory = Path(directory)
    try:
        config, tensors = read_packed(directory)
    except BadInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise BadInputError(f"{directory / WEIGHTS} is unreadable: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'damaged file'}") from None
    bits = config.get("bits")
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise BadInputError(f"{directory}: packed config has no valid 'bits' ({bits!r})")
    for path, shape in config.get("linears", {}).items():
        rows, cols = shape
        for key in ("qweight", "scales"):
            if f"{path}.{key}" not in tensors:
                raise BadInputError(f"{directory}: packed tensor {path}.{key} is missing")
        count = rows * cols
        if f"{path}.mask" in tensors:
            mask = tensors[f"{path}.mask"]
            if mask.size != (count + 7) // 8:
                raise BadInputError(f"{directory}: packed tensor {path}.mask has {mask.size} bytes, "
                                    f"expected {(count + 7) // 8}")
            count = int(np.unpackbits(mask, count=count).sum())
        expected = count if bits > 4 else (count + 1) // 2
        if tensors[f"{path}.qweight"].size != expected:
            raise BadInputError(f"{directory}: packed tensor {path}.qweight has {tensors[f'{path}.qweight'].size} "
                                f"entries, expected {expected} for a {rows}x{cols} linear")
        scales = tensors[f"{path}.scales"]
        group = config.get("group_size")
        groups = -(-cols // group) if scales.ndim == 2 and group else 1
        if scales.size != rows * groups or not np.isfinite(scales).all():
            raise BadInputError(f"{directory}: packed tensor {path}.scales is corrupt "
                                f"({scales.size} values for {rows} rows x {groups} groups, or non-finite)")
    for name, spec in config.get("grouped_matrices", {}).items():
        for key in ("qcodes", "group_scales"):
            if f"{name}.{key}" not in tensors:
                raise BadInputError(f"{directory}: packed tensor {name}.{key} is missing")
    return config, tensors


def _load(directory: Path, dtype, with_tokenizer: bool):
    from toolkit.compress.packed import load_packed

    check_packed(directory)
    try:
        return load_packed(directory, dtype=dtype, with_tokenizer=with_tokenizer)
    except BadInputError:
        raise
    except (RuntimeError, ValueError, KeyError, OSError) as exc:
        raise BadInputError(f"{directory}: packed model does not load: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def from_packed(directory, provenance: dict | None = None) -> QuantizedModel:
    """From a `packed/` directory: the model as `load_packed` rebuilds it (float32) and the stored grids."""
    from toolkit.compress.packed import unpack_linear_codes
    from toolkit.models.view import view_of

    directory = Path(directory)
    config, tensors = check_packed(directory)
    model, tokenizer = _load(directory, torch.float32, True)
    linears = {}
    for path, shape in config["linears"].items():
        parts = {k: tensors[f"{path}.{k}"] for k in ("qweight", "scales", "mask") if f"{path}.{k}" in tensors}
        if f"{path}.g_idx" in tensors:
            raise BadInputError(f"{directory}: activation-ordered groups (g_idx) are not exported to this format",
                                "compress with --actorder static (or none) to export")
        codes = torch.from_numpy(unpack_linear_codes(parts, tuple(shape), config["bits"]).astype(np.int8))
        linears[path] = _grid(codes, torch.from_numpy(parts["scales"].astype(np.float32).copy()),
                              config.get("group_size"))
    metadata = {k: v for k, v in config.items() if k not in ("linears", "grouped_matrices", "quant_method", "format")}
    # every unquantized tensor of a packed file is float16 (or a grouped grid with float16 scales)
    return QuantizedModel(model, tokenizer, view_of(model), config["bits"], linears, metadata, torch.float16,
                          dict(provenance or {}))


def quant_hooks(view, metadata: dict) -> contextlib.ExitStack:
    """Enter the activation / KV fake-quant hooks a compress run evaluated with (a no-op for weight-only runs)."""
    from toolkit.compress.quant import activation_quant, kv_cache_quant

    a_bits, kv_bits = int(metadata.get("a_bits", 16)), int(metadata.get("kv_bits", 16))
    stack = contextlib.ExitStack()
    attention = [view.attention(i) for i in range(len(view))]
    stack.enter_context(activation_quant(view.model, view.quantized_inputs(), a_bits,
                                         float(metadata.get("a_clip_ratio", 1.0))))
    # files written before kv_quant existed used the per-head asymmetric quantizer
    stack.enter_context(kv_cache_quant(view.model, attention, kv_bits, kv_bits,
                                       hadamard=bool(metadata.get("rotation")),
                                       mode=metadata.get("kv_quant", "head-asym")))
    return stack


def load_packed_model(directory, device: str = "cpu", dtype=None, kind: str = "causal-lm",
                      with_tokenizer: bool = True, hooks: bool = True):
    """(model, tokenizer) for `--model packed/`: dequantized weights, online rotations, and (hooks=True) the run's
    activation/KV fake quantization kept installed for the model's lifetime (`model.iclrkit_quant_hooks`)."""
    from toolkit.models.view import view_of

    if kind != "causal-lm":
        raise BadInputError(f"a packed iclrkit directory is a causal LM; it cannot be loaded as {kind}")
    directory = Path(directory)
    config, _ = check_packed(directory)
    model, tokenizer = _load(directory, dtype or torch.float32, with_tokenizer)
    model.to(device).eval()
    model.iclrkit_packed = {k: config.get(k) for k in ("method", "w_bits", "a_bits", "kv_bits", "sparsity",
                                                         "rotation")}
    if hooks and (int(config.get("a_bits", 16)) < 16 or int(config.get("kv_bits", 16)) < 16):
        model.iclrkit_quant_hooks = quant_hooks(view_of(model), config)
        log.info("packed model %s: activations fake-quantized to %s bits, KV cache to %s bits (as its run evaluated)",
                 directory, config.get("a_bits"), config.get("kv_bits"))
    return model, tokenizer


register("model-format", "iclrkit-packed", detect=is_packed_dir)(load_packed_model)
