"""Per-linear stage composition (toolkit/compress/stages.py) against the solver primitives called by hand: the
recipe [sparsegpt, gptq] is SparseGPT pruning (no quantization) → the grid refit on the pruned weights → GPTQ on the
same damped Hessian keeping the mask, as the two-stage method computed it before it became a recipe."""

from __future__ import annotations

import pytest
import torch

from toolkit.compress.config import GptqConfig, SparsegptGptqConfig
from toolkit.compress.job import LinearJob
from toolkit.compress.quant import fit_grid
from toolkit.compress.solvers import activation_order, damp_hessian, gptq, sparsegpt


def _problem(rows=12, cols=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(200, cols, generator=g) * torch.linspace(0.2, 3, cols)
    return torch.randn(rows, cols, generator=g), 2 * X.t() @ X / X.shape[0]


@pytest.mark.parametrize("actorder,group_size,bits", [("static", None, 4), ("group", 16, 3), ("none", 16, 4),
                                                      ("none", None, 16)])
def test_sparsegpt_then_gptq_is_the_primitives_in_order(actorder, group_size, bits):
    from toolkit.compress.methods.staged import RecipeConfig
    from toolkit.compress.stages import linear_stages, run_linear

    W, H_raw = _problem()
    damped = damp_hessian(H_raw, 0.01)
    # by hand: prune (float), refit the grid on the pruned weights, GPTQ keeping the mask
    pruned, keep = sparsegpt(W, damped, None, 16, 0.5, None, 128)
    order = activation_order(H_raw) if actorder != "none" and bits < 16 else None
    expected = pruned
    if bits < 16:
        grid = fit_grid(pruned, bits, False, group_size, order if actorder == "group" else None, full_range=True,
                        search="full")
        expected = gptq(pruned, damped, grid.per_column(W.shape[1]), bits, mask=keep, blocksize=128, order=order)
    knobs = {"w_bits": bits, "group_size": group_size, "actorder": actorder, "w_clip": False, "w_range": "full"}
    recipe = RecipeConfig(model="m", stages=["sparsegpt", {"gptq": knobs}])
    staged, staged_keep, _ = run_linear(LinearJob(W, H_raw, damped, recipe), linear_stages(recipe))
    method = SparsegptGptqConfig(model="m", **knobs)
    from toolkit.compress.methods.sparsegpt import sparsegpt_gptq

    two_stage, _, _ = sparsegpt_gptq(LinearJob(W, H_raw, damped, method))
    assert torch.equal(staged, expected) and torch.equal(two_stage, expected)
    assert torch.equal(staged_keep, keep) and 0.45 < 1 - keep.float().mean() < 0.55
    assert bool((staged[~keep] == 0).all())


def test_a_mask_stage_hands_its_mask_to_the_quantizer():
    """[wanda, gptq] quantizes the dense W with the Wanda mask, as `compress gptq --sparsity --set mask=wanda`."""
    from toolkit.compress.methods.gptq import gptq as gptq_method
    from toolkit.compress.methods.staged import RecipeConfig
    from toolkit.compress.stages import linear_stages, run_linear

    W, H_raw = _problem(seed=1)
    damped = damp_hessian(H_raw, 0.01)
    recipe = RecipeConfig(model="m", stages=[{"wanda": {"sparsity": 0.5}}, {"gptq": {"actorder": "none"}}])
    staged, keep, _ = run_linear(LinearJob(W, H_raw, damped, recipe), linear_stages(recipe))
    method = GptqConfig(model="m", sparsity=0.5, mask="wanda", actorder="none", w_clip=False, w_range="full")
    expected, expected_keep, _ = gptq_method(LinearJob(W, H_raw, damped, method))
    assert torch.equal(staged, expected) and torch.equal(keep, expected_keep)
    assert not torch.equal(keep, torch.ones_like(keep))


def test_auto_knobs_follow_the_rotate_stage():
    from toolkit.compress.methods.staged import RecipeConfig

    plain = RecipeConfig(model="m", stages=["gptq"]).stages[0]["gptq"]
    rotated = RecipeConfig(model="m", stages=["rotate", "gptq"]).stages[1]["gptq"]
    assert (plain["actorder"], plain["w_clip"], plain["w_range"]) == ("static", False, "full")
    assert (rotated["actorder"], rotated["w_clip"], rotated["w_range"]) == ("none", True, "signed")
