"""Quantizers shared by every compression method, so one recipe compares them fairly.

- Weights: per output channel (or per group of `group_size` input columns of a row), symmetric,
  `q = s·clamp(round(w/s), −2^{b−1}, 2^{b−1}−1)` with the scale chosen by an MSE clip search (GPTQ/QuaRot: grid 100,
  max shrink 0.8, error norm 2.4). Symmetric grids contain 0, so pruned weights stay exactly 0 after quantization.
  `WeightGrid` holds the scales: [out] per channel, [out, ⌈in/g⌉] grouped, plus `g_idx` (the group of each input
  column) when the groups follow the activation order (GPTQ `actorder=group`).
- Activations: per token, symmetric (QuaRot's A4 default, clip ratio 1.0), simulated (fake quant) on CPU with the
  quantizer the INT4 kernels run (`toolkit.ops.int4.per_token_codes`: codes in ±(2^{b−1}−1), e.g. ±7 at 4 bits).
- KV cache (`kv_quant`): "token-sym" (default, QuaRot's KV4: symmetric, one scale per token over the whole K or V
  row, i.e. all KV heads, codes in ±(2^{b−1}−1), clip 1.0) or "head-asym" (asymmetric min/max per token and head, the
  only scheme before 2026-12-03). K is quantized after RoPE (and after the head-dim Hadamard on rotated models), V as
  it enters attention.
"""

from __future__ import annotations

import contextlib
import typing
from dataclasses import dataclass

import torch

from toolkit.compress.config import KvQuant
from toolkit.core.errors import BadInputError
from toolkit.ops.int4 import per_token_codes


def max_code(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def _broadcast_scale(scale: torch.Tensor, dtype) -> torch.Tensor:
    """A per-row scale [rows] as a column [rows, 1]; a per-entry scale [rows, columns] as it is."""
    s = scale.to(dtype)
    return s if s.dim() == 2 else s.reshape(-1, 1)


def quantize_rows(W: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Fake-quantize W on its symmetric grid: `scale` has one entry per row, or one per entry ([rows, columns], as
    `WeightGrid.per_column` expands grouped scales)."""
    return codes_of(W, scale, bits) * _broadcast_scale(scale, W.dtype)


def codes_of(W: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes (as float) of W on the symmetric grid (per-row or per-entry scale, as `quantize_rows`)."""
    return torch.clamp(torch.round(W / _broadcast_scale(scale, W.dtype)), -max_code(bits) - 1, max_code(bits))


COARSE_STRIDE = 4  # the coarse clip search's step over the candidate ratios (fit_weight_scale)


def fit_weight_scale(W: torch.Tensor, bits: int, mse: bool = True, grid: int = 100, maxshrink: float = 0.8,
                     norm: float = 2.4, full_range: bool = False, search: str = "full") -> torch.Tensor:
    """Per-row symmetric scale: max|w|/(2^{b−1}−1) (`full_range`: max|w|/(2^{b−1}−½), llm-compressor's min-max,
    which puts the most negative weight on code −2^{b−1}), shrunk by the clip ratio that minimises Σ|Q(w)−w|^norm
    over the ratios 1 − i/grid, i < maxshrink·grid. `search` "full" tries every ratio (GPTQ's reference); "coarse"
    tries every COARSE_STRIDE-th, then the stride−1 ratios on either side of each row's best: 26 of 80 error passes,
    the same ratio wherever the row's error curve has one minimum at that stride (98.5 % of SmolLM2-135M's rows)."""
    W = W.float()
    xmax = W.abs().amax(dim=1).clamp(min=1e-8)
    top = max_code(bits) + (0.5 if full_range else 0.0)
    if not mse:
        return xmax / top
    if search not in ("full", "coarse"):
        raise ValueError(f"unknown clip search {search!r}")
    work = torch.empty_like(W)  # one buffer, in-place steps: ~5x faster than fresh tensors, the same bits
    low, high = -max_code(bits) - 1, max_code(bits)
    count = int(maxshrink * grid)
    best_err = torch.full_like(xmax, float("inf"))
    best_i = torch.zeros(xmax.shape, dtype=torch.long, device=W.device)

    # the ratios as the reference computes them (a Python float per candidate, rounded to W's dtype)
    ratios = torch.tensor([1 - i / grid for i in range(count)], dtype=torch.float64).to(W.dtype).to(W.device)

    def consider(i: torch.Tensor) -> None:  # i: one candidate index per row
        nonlocal best_err, best_i
        column = (ratios[i] * xmax / top).reshape(-1, 1)
        torch.div(W, column, out=work)
        err = work.round_().clamp_(low, high).mul_(column).sub_(W).abs_().pow_(norm).sum(dim=1)  # Σ|Q(w) − w|^p
        better = (err < best_err) | ((err == best_err) & (i < best_i))  # ties: the lower index, as the full scan
        best_err = torch.where(better, err, best_err)
        best_i = torch.where(better, i, best_i)

    stride = COARSE_STRIDE if search == "coarse" else 1
    for i in range(0, count, stride):
        consider(torch.full_like(best_i, i))
    if stride > 1:
        centre = best_i.clone()
        for d in (*range(-stride + 1, 0), *range(1, stride)):
            consider((centre + d).clamp(0, count - 1))
    return ratios[best_i] * xmax / top


@dataclass
class WeightGrid:
    """The quantizer of one linear: `scales` [out] (per channel) or [out, ⌈in/group_size⌉] (grouped). Groups are
    runs of `group_size` consecutive input columns unless `g_idx` [in] names each column's group (the activation
    order's groups, GPTQ `actorder=group`)."""

    scales: torch.Tensor
    group_size: int | None = None
    g_idx: torch.Tensor | None = None

    def group_index(self, columns: int) -> torch.Tensor:
        if self.g_idx is not None:
            return self.g_idx
        return torch.arange(columns, device=self.scales.device) // self.group_size

    def per_column(self, columns: int) -> torch.Tensor:
        """[out] per channel (unchanged), or the scale of every entry [out, columns] for grouped grids."""
        if self.group_size is None:
            return self.scales
        return self.scales[:, self.group_index(columns)]


def fit_grid(W: torch.Tensor, bits: int, mse: bool = True, group_size: int | None = None,
             order: torch.Tensor | None = None, full_range: bool = False, search: str = "full") -> WeightGrid:
    """Scales fitted on W as it is (before any GPTQ update, as llm-compressor's observers do): per row, or per
    group of `group_size` columns (a ragged last group when the width is not a multiple). With `order` (a column
    permutation), groups are runs of the permuted columns (`actorder=group`) and `g_idx` maps them back."""
    if group_size is None:
        return WeightGrid(fit_weight_scale(W, bits, mse=mse, full_range=full_range, search=search).to(W.dtype))
    rows, columns = W.shape
    source = W if order is None else W[:, order]
    padded = torch.nn.functional.pad(source, (0, -columns % group_size))  # zeros: no error, no effect on max
    scales = fit_weight_scale(padded.reshape(-1, group_size), bits, mse=mse, full_range=full_range,
                              search=search).reshape(rows, -1).to(W.dtype)
    g_idx = None
    if order is not None:
        g_idx = torch.empty(columns, dtype=torch.long, device=W.device)
        g_idx[order] = torch.arange(columns, device=W.device) // group_size
    return WeightGrid(scales, group_size, g_idx)


def fake_quant_per_token(x: torch.Tensor, bits: int, clip_ratio: float = 1.0) -> torch.Tensor:
    """Symmetric per-token (last dimension) fake quantization of activations: the kernels' quantizer
    (`toolkit.ops.int4.per_token_codes`, codes in ±(2^{b−1}−1)) dequantized, in x's dtype."""
    if bits >= 16:
        return x
    codes, scale = per_token_codes(x, bits, clip_ratio)
    return codes * scale


def fake_quant_asym(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Asymmetric min/max fake quantization along the last dimension (one KV head's vector per token)."""
    if bits >= 16:
        return x
    scale, zero = kv_quant_params(x, bits, "head-asym")
    return (torch.clamp(torch.round(x / scale) + zero, 0, 2 ** bits - 1) - zero) * scale


KV_MODES = typing.get_args(KvQuant)  # declared once, on CompressConfig.kv_quant


def kv_quant_params(x: torch.Tensor, bits: int, mode: str = "token-sym") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The KV quantizer's (scale, zero point or None) for K or V laid out [batch, kv_heads, seq, head_dim]:
    "token-sym": scale [batch, 1, seq, 1] = max over all heads and head_dim of |x| / (2^{b−1}−1) (1 for an all-zero
    token), no zero point; "head-asym": scale and zero [batch, kv_heads, seq, 1] from each head's min/max."""
    if mode == "token-sym":
        top = max_code(bits)
        amax = x.abs().amax(dim=(1, 3), keepdim=True)
        return torch.where(amax > 0, amax / top, torch.ones_like(amax)), None
    if mode == "head-asym":
        levels = 2 ** bits - 1
        low, high = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
        scale = ((high - low) / levels).clamp(min=1e-8)
        return scale, torch.round(-low / scale)
    raise BadInputError(f"unknown KV quantizer {mode!r}; choose one of {', '.join(KV_MODES)}")


def fake_quant_kv(x: torch.Tensor, bits: int, mode: str = "token-sym") -> torch.Tensor:
    """Fake-quantize K or V [batch, kv_heads, seq, head_dim] with `kv_quant_params`' grid, in x's dtype."""
    if bits >= 16:
        return x
    if mode == "head-asym":
        return fake_quant_asym(x, bits)  # bit-identical to the only KV quantizer before 2026-12-03
    scale, _ = kv_quant_params(x, bits, mode)
    return torch.clamp(torch.round(x / scale), -max_code(bits), max_code(bits)) * scale


@contextlib.contextmanager
def activation_quant(model, linear_paths: list[str], bits: int, clip_ratio: float = 1.0):
    """Fake-quantize the input of each listed linear per token (lm_head is never listed: it stays 16-bit)."""
    if bits >= 16:
        yield
        return
    handles = []
    for path in linear_paths:
        module = model.get_submodule(path)
        handles.append(module.register_forward_pre_hook(
            lambda mod, args: (fake_quant_per_token(args[0], bits, clip_ratio), *args[1:])))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


_KV_ATTENTION = "iclrkit_kvquant"


def _kv_quant_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention with fake-quantized K (after RoPE) and V; with a rotated model Q and K are first multiplied by an
    orthonormal Hadamard over the head dimension (QuaRot), which leaves QKᵀ unchanged but spreads outliers."""

    settings = module.iclrkit_kv
    if settings["hadamard"]:
        from toolkit.ops.hadamard import fwht

        query, key = fwht(query.contiguous()), fwht(key.contiguous())
    key = fake_quant_kv(key, settings["k_bits"], settings["mode"])
    value = fake_quant_kv(value, settings["v_bits"], settings["mode"])
    return _inner_attention(module, settings["inner"])(module, query, key, value, attention_mask, **kwargs)


def _inner_attention(module, name: str):
    """The attention function the model would have run: a registered implementation, or for "eager" the modeling
    file's own `eager_attention_forward` (Gemma 2 soft-caps its scores there; eager is not in the registry)."""
    import sys

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if name == "eager":
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise BadInputError(f"{type(module).__name__} runs eager attention without an eager_attention_forward "
                                "function: KV quantization cannot wrap it")
        return eager
    return ALL_ATTENTION_FUNCTIONS[name]


@contextlib.contextmanager
def kv_cache_quant(model, attention_modules: list, k_bits: int, v_bits: int, hadamard: bool,
                   mode: str = "token-sym"):
    """Route attention through `_kv_quant_attention` while the block is active (models using the HF attention
    interface: Llama, Qwen, Mistral, GPT-2); `mode` is the KV quantizer (`kv_quant_params`)."""
    if mode not in KV_MODES:
        raise BadInputError(f"unknown KV quantizer {mode!r}; choose one of {', '.join(KV_MODES)}")
    if k_bits >= 16 and v_bits >= 16:
        yield
        return
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(_KV_ATTENTION, _kv_quant_attention)
    config = model.config
    inner = config._attn_implementation or "sdpa"
    if inner == _KV_ATTENTION:
        raise BadInputError("KV quantization is already active on this model")
    for module in attention_modules:
        module.iclrkit_kv = {"k_bits": k_bits, "v_bits": v_bits, "hadamard": hadamard, "inner": inner, "mode": mode}
    config._attn_implementation = _KV_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = inner
        for module in attention_modules:
            del module.iclrkit_kv
