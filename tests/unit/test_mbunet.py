"""MBU-Net math: weight quantization, BN -> threshold folding, exact conversion, cost-aware masking, training."""

import itertools

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.segment import kernels
from toolkit.segment.budget import choose_mask_ratios, layer_bitops, total_bitops, uniform_gains, zero_fractions
from toolkit.segment.data import load_folder, procedural_scenes
from toolkit.segment.mbunet import (
    QuantBlock,
    SignSTE,
    UNet,
    bn_affine,
    iou_per_class,
    load_model,
    mean_iou,
    quantize_weight,
    save_model,
)
from toolkit.segment.packed import convert, fold_threshold, load_packed, save_packed
from toolkit.segment.train import train_steps


def test_quantize_binary_and_masked():
    w = torch.randn(4, 3, 3, 3)
    q, alpha = quantize_weight(w, 0.0)
    assert torch.equal(q, torch.where(w >= 0, 1.0, -1.0))
    assert torch.allclose(alpha, w.abs().flatten(1).mean(1))
    q, alpha = quantize_weight(w, 0.5)
    flat, qf = w.abs().flatten(1), q.flatten(1)
    for o in range(4):
        kept = qf[o] != 0
        assert int((~kept).sum()) == 13  # floor(0.5 * 27) smallest magnitudes zeroed
        assert flat[o][kept].min() > flat[o][~kept].max()
        assert torch.allclose(alpha[o], flat[o][kept].mean())
        assert torch.equal(qf[o][kept], torch.sign(w.flatten(1)[o][kept]))


def test_threshold_rule_matches_a_per_channel_loop():
    torch.manual_seed(1)
    w = torch.randn(5, 7, 3, 3)
    q, alpha = quantize_weight(w, 0.7, "threshold")
    for o in range(5):  # TWN: Delta = 0.7 * mean|w| of the output channel, computed here in plain Python
        values = w[o].flatten().tolist()
        delta = 0.7 * sum(abs(v) for v in values) / len(values)
        kept = [abs(v) for v in values if abs(v) > delta]
        assert q[o].flatten().tolist() == [(1.0 if v >= 0 else -1.0) if abs(v) > delta else 0.0 for v in values]
        assert alpha[o].item() == pytest.approx(sum(kept) / len(kept))
    assert torch.equal(quantize_weight(w, 0.0, "threshold")[0], torch.where(w >= 0, 1.0, -1.0))


def test_sign_ste_forward_and_clipped_gradient():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], requires_grad=True)
    y = SignSTE.apply(x)
    assert torch.equal(y, torch.tensor([-1.0, -1.0, 1.0, 1.0, 1.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0]))


def test_threshold_folding_matches_bn_sign_for_every_sum():
    torch.manual_seed(0)
    block = QuantBlock(5, 6, quantized=True).eval()
    block.mask_ratio = 0.3
    with torch.no_grad():
        block.bn.weight.copy_(torch.tensor([1.5, -0.7, 0.0, 0.3, -2.0, 1.0]))
        block.bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3, 0.0, 0.5, 0.0]))
        block.bn.running_mean.copy_(torch.randn(6))
        block.bn.running_var.copy_(torch.rand(6) + 0.1)
    threshold, flip = fold_threshold(block)
    assert flip.tolist()[:2] == [False, True]
    _, alpha = block.integer_weight()
    s = torch.arange(-45, 46, dtype=torch.float32)
    for o in range(6):  # brute force over every reachable integer sum
        want = bn_affine(s.expand(1, 6, len(s)), alpha, block.bn)[0, o] >= 0
        got = s <= threshold[o] if flip[o] else s >= threshold[o]
        assert torch.equal(got, want), o


def _trained_tiny(variant="masked", steps=3, rule="ratio"):
    torch.manual_seed(0)
    data = procedural_scenes(4, 16, 4, seed=1)
    model = UNet(8, 2, 4, variant, rule)
    if variant == "masked":
        model.set_mask_ratios({"enc.0.0": 0.5, "enc.2.1": 0.3, "fuse.1": 0.7})
    train_steps(model, data.images, data.masks, steps, 4, 1e-2, 0)
    with torch.no_grad():  # negative BN scales must fold too (pitfall 4)
        model.enc[1][0].bn.weight[:3] *= -1
    return model.eval(), data


@pytest.mark.parametrize("variant, rule", [("masked", "ratio"), ("masked", "threshold"), ("binary", "ratio")])
def test_conversion_preserves_outputs_exactly(variant, rule, tmp_path):
    model, data = _trained_tiny(variant, rule=rule)
    packed = convert(model)
    with torch.no_grad():
        reference = model(data.images)
    save_model(model, tmp_path)
    reloaded_float, arch = load_model(tmp_path)
    assert arch["mask_rule"] == rule and torch.equal(reloaded_float(data.images), reference)
    zeros = zero_fractions(model)
    assert set(zeros) == ({"enc.0.0", "enc.2.1", "fuse.1"} if variant == "masked" else set())
    if rule == "ratio" and variant == "masked":
        assert zeros["enc.0.0"] == 0.5  # floor(0.5 * 8 * 9) of 72 weights per channel
    assert torch.equal(packed(data.images), reference)
    assert any(not layer.binary for layer in packed.layers.values()) == (variant == "masked")
    save_packed(packed, tmp_path)
    reloaded, _ = load_packed(tmp_path)
    assert torch.equal(reloaded(data.images), reference)


def test_packed_layer_matches_float_reference_on_the_models_inputs():
    model, data = _trained_tiny()
    packed = convert(model)
    record = {}
    packed.features(data.images[:2], record)
    for name, bits in record.items():
        layer = packed.layers[name]
        ref = kernels.ternary_conv2d_reference(bits, layer.pos, layer.neg, 1, 1, layer.segments)
        assert torch.equal(layer.sums(bits), ref), name


def test_training_lowers_loss():
    torch.manual_seed(0)
    data = procedural_scenes(8, 16, 3, seed=2)
    model = UNet(4, 1, 3, "masked")
    model.set_mask_ratios({name: 0.3 for name in model.quant_blocks()})
    losses, _ = train_steps(model, data.images, data.masks, 30, 4, 1e-2, 0)
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5


def test_cost_aware_choice_respects_budget_and_ranks_gain_per_cost():
    costs = {"a": 100, "b": 10, "c": 50, "d": 40}
    gains = {"a": {0.3: 0.5, 0.5: 0.9}, "b": {0.3: 0.2, 0.5: 0.1}, "c": {0.3: -0.1, 0.5: -0.2},
             "d": {0.3: 0.3, 0.5: 0.35}}
    # ratios per cost: b 0.02, d 0.00875, a 0.009 -> b, a, d; c never (negative gain)
    assert choose_mask_ratios(gains, costs, budget=1.0) == {"a": 0.5, "b": 0.3, "c": 0.0, "d": 0.5}
    assert choose_mask_ratios(gains, costs, budget=0.0) == {name: 0.0 for name in costs}
    chosen = choose_mask_ratios(gains, costs, budget=0.5)  # 100 extra bit-ops: b (10), then a does not fit, d
    assert chosen == {"a": 0.0, "b": 0.3, "c": 0.0, "d": 0.5}


def test_uniform_sensitivity_masks_as_many_layers_as_the_budget_allows():
    costs = {"enc": 4, "mid": 9, "up": 16, "fuse": 16, "deep": 2, "dec": 7}
    for budget in (0.0, 0.1, 0.25, 0.5, 0.8, 1.0):
        chosen = choose_mask_ratios(uniform_gains(costs, 0.5), costs, budget)
        picked = {name for name, ratio in chosen.items() if ratio > 0}
        allowed = budget * sum(costs.values())
        fitting = [s for k in range(len(costs) + 1) for s in itertools.combinations(costs, k)
                   if sum(costs[n] for n in s) <= allowed]  # exhaustive: equal gains -> most layers wins
        assert sum(costs[n] for n in picked) <= allowed
        assert len(picked) == max(len(s) for s in fitting), budget
        assert set(chosen.values()) <= {0.0, 0.5}
    assert {n for n, r in choose_mask_ratios(uniform_gains(costs, 0.5), costs, 0.25).items() if r} == \
        {"deep", "enc", "dec"}  # cheapest first: 2 + 4 + 7 = 13 <= 13.5


def test_greedy_equals_brute_force_when_costs_are_equal():
    torch.manual_seed(3)
    names = list("abcde")
    costs = {n: 7 for n in names}
    gains = {n: {0.5: float(torch.randn(()))} for n in names}
    chosen = choose_mask_ratios(gains, costs, budget=0.4)  # two layers fit
    best = max((s for k in range(3) for s in itertools.combinations(names, k)),
               key=lambda s: sum(gains[n][0.5] for n in s if gains[n][0.5] > 0))
    assert {n for n, r in chosen.items() if r > 0} == {n for n in best if gains[n][0.5] > 0}


def test_bitops_count_matches_hand_count():
    model = UNet(4, 1, 2, "binary")
    costs = layer_bitops(model, 16)
    assert costs["enc.0.0"] == 16 * 16 * 4 * 4 * 9
    assert costs["enc.1.0"] == 8 * 8 * 4 * 8 * 9
    assert costs["fuse.0"] == 16 * 16 * 8 * 4 * 9
    assert total_bitops(costs, {"enc.0.0": 0.5}) == sum(costs.values()) + costs["enc.0.0"]


def test_iou_against_hand_count():
    target = torch.tensor([[0, 0, 1, 1], [2, 2, 1, 0]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 0, 1, 0]])
    ious = iou_per_class(pred, target, 4)
    assert ious[:3] == pytest.approx([2 / 4, 3 / 4, 1 / 2]) and ious[3] is None
    assert mean_iou(ious) == pytest.approx(100 * (0.5 + 0.75 + 0.5) / 3)


def test_procedural_scenes_deterministic_and_labelled():
    a, b = procedural_scenes(3, 32, 4, seed=5), procedural_scenes(3, 32, 4, seed=5)
    assert torch.equal(a.images, b.images) and torch.equal(a.masks, b.masks)
    assert set(a.masks.unique().tolist()) <= {0, 1, 2, 3} and len(a.masks.unique()) >= 2
    with pytest.raises(BadInputError):
        procedural_scenes(2, 32, 9)


def test_folder_loader_and_bad_folders(tmp_path):
    import numpy as np
    from PIL import Image

    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    for i in range(2):
        Image.fromarray(np.full((20, 20, 3), 40 * i, dtype=np.uint8)).save(tmp_path / "images" / f"im{i}.jpg")
        Image.fromarray(np.eye(20, dtype=np.uint8) * (i + 1)).save(tmp_path / "masks" / f"im{i}.png")
    data = load_folder(tmp_path, size=16)
    assert data.images.shape == (2, 3, 16, 16) and data.num_classes == 3
    with pytest.raises(BadInputError):
        load_folder(tmp_path, size=16, num_classes=2)  # mask value 2 with 2 classes
    (tmp_path / "masks" / "im1.png").unlink()
    with pytest.raises(BadInputError):
        load_folder(tmp_path, size=16)
    with pytest.raises(BadInputError):
        load_folder(tmp_path / "missing")
