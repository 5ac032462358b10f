"""Issue 30 levers of MBU-Net: Bi-Real shortcuts, ReActNet RSign/RPReLU, two-stage training, distillation; the
packed kernels must run shortcut networks bit-exactly (same logits as the float model's eval forward)."""

import pytest
import torch
import torch.nn.functional as F

from toolkit.core.errors import BadInputError
from toolkit.segment import kernels
from toolkit.segment.data import procedural_scenes
from toolkit.segment.mbunet import UNet, channel_shortcut, load_model, save_model
from toolkit.segment.packed import convert, save_packed
from toolkit.segment.train import distill_loss, train_steps


def _trained(learnable, variant="masked", steps=3, **kwargs):
    torch.manual_seed(0)
    data = procedural_scenes(4, 16, 4, seed=1)
    model = UNet(8, 2, 4, variant, shortcut=True, learnable=learnable)
    if variant == "masked":
        model.set_mask_ratios({"enc.0.0": 0.5, "enc.2.1": 0.3, "fuse.1": 0.7})
    train_steps(model, data.images, data.masks, steps, 4, 1e-2, 0, **kwargs)
    with torch.no_grad():
        model.enc[1][0].bn.weight[:3] *= -1  # negative BN scales
        if learnable:  # non-trivial learned thresholds / RPReLU
            for block in model.quant_blocks().values():
                block.beta.uniform_(-0.3, 0.3)
                block.rp_gamma.uniform_(-0.2, 0.2)
                block.rp_zeta.uniform_(-0.2, 0.2)
    return model.eval(), data


def test_channel_shortcut_shapes_and_values():
    r = torch.randn(2, 4, 3, 3)
    assert torch.equal(channel_shortcut(r, 4), r)
    assert torch.equal(channel_shortcut(r, 8)[:, 4:], r)
    torch.testing.assert_close(channel_shortcut(r, 2), (r[:, :2] + r[:, 2:]) / 2)
    with pytest.raises(BadInputError):
        channel_shortcut(r, 3)


def test_shortcut_block_is_bn_of_binary_conv_plus_input():
    """r' = BN(alpha * conv(sign(r), q)) + r, checked against an explicit float computation."""
    model, _ = _trained(False)
    block = model.enc[1][1]
    r = torch.randn(2, block.conv.in_channels, 4, 4)
    q, alpha = block.integer_weight()
    a = torch.where(r >= 0, 1.0, -1.0)
    bn = block.bn
    y = F.batch_norm(F.conv2d(a, q, padding=1) * alpha.view(1, -1, 1, 1),
                     bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    with torch.no_grad():
        torch.testing.assert_close(block(r), y + r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("learnable, variant", [(False, "masked"), (True, "masked"), (True, "binary")])
def test_packed_shortcut_network_equals_float_bit_for_bit(learnable, variant, tmp_path):
    model, data = _trained(learnable, variant)
    with torch.no_grad():
        reference = model(data.images)
    packed = convert(model)
    assert torch.equal(packed(data.images), reference)
    save_model(model, tmp_path)
    reloaded, arch = load_model(tmp_path)
    assert arch["shortcut"] and arch["learnable"] == learnable
    assert torch.equal(reloaded(data.images), reference)
    with pytest.raises(BadInputError):
        save_packed(packed, tmp_path)


def test_packed_shortcut_sums_equal_integer_reference():
    model, data = _trained(True)
    packed = convert(model)
    block, layer = model.fuse[0], packed.layers["fuse.0"]
    r = torch.randn(2, block.conv.in_channels, 8, 8)
    z = block.sign_input(r)
    bits = torch.cat([kernels.pack_sign(p.contiguous()) for p in z.split(layer.segments, 1)], -1)
    ref = kernels.ternary_conv2d_reference(bits, layer.pos, layer.neg, 1, 1, layer.segments)
    q, _ = block.integer_weight()
    dense = F.conv2d(torch.where(z >= 0, 1.0, -1.0), q, padding=1).round().to(torch.int32).permute(0, 2, 3, 1)
    assert torch.equal(layer.sums(bits), ref) and torch.equal(ref, dense)


def test_learnable_needs_shortcut():
    with pytest.raises(BadInputError):
        UNet(8, 2, 4, "binary", shortcut=False, learnable=True)


def test_two_stage_uses_real_activations_first_then_binary():
    model = UNet(8, 2, 4, "binary")
    seen = []
    model.enc[1][0].register_forward_hook(lambda m, i, o: seen.append(bool(((o.abs() - 1).abs() > 1e-6).any())))
    data = procedural_scenes(4, 16, 4, seed=1)
    train_steps(model, data.images, data.masks, 4, 4, 1e-2, 0, stage1_steps=2)
    assert seen == [True, True, False, False]  # hardtanh outputs (not all ±1), then sign
    assert all(block.binary_act for block in model.quant_blocks().values())


def test_distill_loss_is_kl_and_zero_for_equal_logits():
    torch.manual_seed(0)
    s, t = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    assert distill_loss(t, t, 2.0).abs() < 1e-6
    p, logq = F.softmax(t / 2, 1), F.log_softmax(s / 2, 1)
    want = (p * (p.log() - logq)).sum(1).mean() * 4
    torch.testing.assert_close(distill_loss(s, t, 2.0), want)
    teacher = UNet(8, 2, 4, "fp32").eval()
    model = UNet(8, 2, 4, "binary", shortcut=True, learnable=True)
    data = procedural_scenes(4, 16, 4, seed=1)
    losses, _ = train_steps(model, data.images, data.masks, 2, 4, 1e-2, 0, teacher=teacher, distill=0.5)
    assert all(torch.isfinite(torch.tensor(losses)))
