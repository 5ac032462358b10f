"""One linear's compression job, handed to the registered method (toolkit/compress/methods/): its weight, raw and
damped Hessian, the config, and the pieces several methods share (activation order, weight grid, mask), each
computed only when a method asks for it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol


@dataclass
class LinearJob:
    W: Any  # (out, in) weight in the solve dtype
    hessian_raw: Any  # 2/n Σ x xᵀ over the calibration tokens (undamped)
    hessian: Any  # damped (solvers.damp_hessian) when the method needs_hessian, else None
    config: Any
    keep: Any = None  # the kept entries an earlier recipe stage chose (toolkit.compress.stages); None: the config's

    @property
    def bits(self) -> int:
        return self.config.w_bits

    @cached_property
    def order(self):
        """Activation order (GPTQ and the two-stage baseline: configs with `actorder`), or None."""
        from toolkit.compress.solvers import activation_order

        actorder = getattr(self.config, "actorder", "none")
        return activation_order(self.hessian_raw) if actorder != "none" and self.bits < 16 else None

    @property
    def group_order(self):
        return self.order if getattr(self.config, "actorder", "none") == "group" else None

    def fit_grid(self, weights=None):
        """The weight grid fitted on `weights` (default: the dense W), or None for float weights."""
        from toolkit.compress.quant import fit_grid

        if self.bits >= 16:
            return None
        clip = self.config.w_clip  # None: a config run_compress did not resolve (config.resolve_defaults) — clip
        return fit_grid(self.W if weights is None else weights, self.bits, clip is None or clip,
                        self.config.group_size, self.group_order, full_range=self.config.w_range == "full",
                        search=self.config.w_clip_search)

    @cached_property
    def grid(self):
        return self.fit_grid()

    @property
    def scale(self):
        """The grid's scale per column (what the solvers take), or None."""
        return self.grid.per_column(self.W.shape[1]) if self.grid is not None else None

    @cached_property
    def mask(self):
        """Kept entries: the config's mask (magnitude or Wanda scores) at its sparsity / N:M, or all ones. Only for
        a method whose config declares the scores (config.MaskedConfig). In a recipe, the mask an earlier stage chose
        (`keep`)."""
        import torch

        if self.keep is not None:
            return self.keep

        from toolkit.compress.config import MaskedConfig
        from toolkit.compress.masks import magnitude_scores, make_mask, parse_nm, wanda_scores

        if not isinstance(self.config, MaskedConfig):
            raise TypeError(f"{type(self.config).__name__} has no `mask` field: a method that reads LinearJob.mask "
                            "takes a config.MaskedConfig")
        nm = parse_nm(self.config.nm)
        if self.config.sparsity > 0 or nm:
            scores = (wanda_scores(self.W, torch.diag(self.hessian_raw) / 2) if self.config.mask == "wanda"
                      else magnitude_scores(self.W))
            return make_mask(scores, self.config.sparsity, nm)
        return torch.ones_like(self.W, dtype=torch.bool)

    def rounded(self, keep):
        """(W·keep rounded to the weight grid — or kept as it is with float weights —, keep, grid): the tail of every
        prune-then-RTN method."""
        from toolkit.compress.quant import quantize_rows

        scale = self.scale
        out = quantize_rows(self.W * keep, scale, self.bits) if scale is not None else self.W * keep
        return out, keep, self.grid


class CompressMethod(Protocol):
    """A registered compression method (`@register("compress", NAME, config=..., needs_hessian=..., ...)`,
    toolkit/compress/methods/): one linear's job in, (compressed W, kept-entries mask, weight grid or None) out."""

    def __call__(self, job: LinearJob) -> tuple[Any, Any, Any]: ...
