"""LRP (toolkit/explain/lrp.py) and CAVE's NOV-aware LRP explanation: conservation, rules against an explicit
matrix reference, and (when importable) against zennit's rules."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.explain import lrp
from toolkit.explain.cave import Backbone, CaveModel, concept_relevance


def _tiny_backbone(seed=0, width=4, feature_dim=6, bias=True):
    """bias=False: every folded bias is zero (conv bias 0, BN shift = mean * scale), the setting in which the
    bias-free rules conserve exactly (a unit switched on by its bias alone has no input to pass relevance to)."""
    torch.manual_seed(seed)
    net = Backbone(feature_dim, width)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial eval statistics so that folding is exercised
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.1, 0.1)
            if not bias:
                m.bias.data = m.running_mean * m.weight.data / torch.sqrt(m.running_var + m.eps)
        if isinstance(m, nn.Conv2d) and not bias:
            m.bias.data.zero_()
    return net.eval()


def _matrix(layer, in_shape):
    """The conv (bias excluded) as a dense matrix (out, in), from unit impulses: an independent reference."""
    n = int(np.prod(in_shape))
    basis = torch.eye(n, dtype=torch.float64).reshape(n, *in_shape)
    out = F.conv2d(basis, layer.weight.double(), None, layer.stride, layer.padding)
    return out.reshape(n, -1).T


def test_fold_matches_module_forward():
    net = _tiny_backbone()
    x = torch.rand(2, 3, 16, 16)
    _, z = lrp.forward_inputs(lrp.fold_sequential(net.net), x)
    torch.testing.assert_close(z, net(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rule", ["epsilon", "zplus", "zbox"])
def test_rule_matches_dense_reference(rule):
    torch.manual_seed(1)
    layer = lrp.FoldedConv(torch.randn(3, 2, 3, 3), torch.randn(3), (2, 2), (1, 1), True)
    x = torch.rand(1, 2, 6, 6) if rule != "epsilon" else torch.randn(1, 2, 6, 6)
    r_out = torch.randn(1, 1, 3, 3, 3)
    got = lrp.lrp_layer(x, layer, r_out, rule, eps=1e-9).double().reshape(-1)
    w = _matrix(layer, (2, 6, 6))
    xv, rv = x.double().reshape(-1), r_out.double().reshape(-1)
    if rule == "epsilon":
        z = w @ xv
        want = xv * (w.T @ (rv / z))
    elif rule == "zplus":
        wp = w.clamp(min=0)
        want = xv * (wp.T @ (rv / (wp @ xv)))
    else:
        wp, wn = w.clamp(min=0), w.clamp(max=0)
        lo, hi = torch.zeros_like(xv), torch.ones_like(xv)
        s = rv / (w @ xv - wp @ lo - wn @ hi)
        want = xv * (w.T @ s) - lo * (wp.T @ s) - hi * (wn.T @ s)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_conservation_through_backbone():
    """Bias-free rules: the input relevance sums to the output relevance (per explained quantity)."""
    net = _tiny_backbone(bias=False)
    assert all(abs(layer.bias).max() < 1e-6 for layer in lrp.fold_sequential(net.net))
    layers = lrp.fold_sequential(net.net)
    x = torch.rand(2, 3, 16, 16)
    inputs, z = lrp.forward_inputs(layers, x)
    r_top = z[:, None] * torch.rand(2, 3, *z.shape[1:])  # signed, like the NOV-aware relevances
    r_in = lrp.lrp_backward(layers, inputs, r_top, lrp.default_rules(len(layers)), eps=1e-9)
    torch.testing.assert_close(r_in.sum((2, 3, 4)), r_top.sum((2, 3, 4)), atol=1e-4, rtol=0)


def test_nov_rule_splits_cell_relevance_over_channels():
    torch.manual_seed(2)
    f = F.normalize(torch.randn(1, 5, 2, 2), dim=1)
    h = F.normalize(torch.randn(1, 3, 5), dim=-1)
    r = torch.rand(1, 3, 2, 2)
    out = lrp.nov_feature_relevance(f, h, r, eps=0.0)
    torch.testing.assert_close(out.sum(2), r)
    # channel c of cell (0, 1), concept 2: R * f_c h_c / cos
    c, i, j, d = 3, 0, 1, 2
    want = r[0, d, i, j] * f[0, c, i, j] * h[0, d, c] / (f[0, :, i, j] * h[0, d]).sum()
    assert out[0, d, c, i, j].item() == pytest.approx(want.item(), rel=1e-5)


@pytest.mark.parametrize("classifier", ["repo", "paper"])
def test_cave_lrp_maps_sum_to_concept_relevance(classifier):
    """The explained quantity of concept h is sum_i R(i, h) (the soft class score share): the pixel map sums to it."""
    net = _tiny_backbone(3, bias=False)
    torch.manual_seed(3)
    concepts = F.normalize(torch.randn(7, 6), dim=1)
    concept_class = torch.tensor([0, 0, 0, 1, 1, 1, -1])
    model = CaveModel(net, concepts, concept_class, torch.zeros(1, 6), 2, classifier, 0.07, 7.0, "lrp", "epsilon")
    images, labels = torch.rand(3, 3, 16, 16), torch.tensor([0, 1, 1])
    maps = model.explain_lrp(images, labels, eps=1e-9)  # the stabiliser is the only leak; this net's z are ~1e-3
    assert maps.shape == (3, 3, 16, 16)
    assert model.explain(images, labels).shape == maps.shape
    cos = torch.einsum("bdhw,md->bmhw", model.features(images), concepts)
    want = concept_relevance(cos, concept_class, labels, classifier, 0.07).sum((2, 3))
    torch.testing.assert_close(maps.sum((2, 3)), want, atol=1e-4, rtol=0)
    gaussian = CaveModel(net, concepts, concept_class, torch.zeros(1, 6), 2, classifier, 0.07, 7.0, "gaussian")
    torch.testing.assert_close(gaussian.explain(images, labels).sum((2, 3)), want, atol=1e-4, rtol=0)


def test_matches_zennit():
    zennit = pytest.importorskip("zennit")  # noqa: F841  (zennit needs torchvision to import)
    from zennit.canonizers import SequentialMergeBatchNorm
    from zennit.composites import NameMapComposite
    from zennit.rules import Epsilon, Pass, ZBox, ZPlus

    net = _tiny_backbone(4)
    layers = lrp.fold_sequential(net.net)
    convs = [name for name, m in net.named_modules() if isinstance(m, nn.Conv2d)]
    relus = [name for name, m in net.named_modules() if isinstance(m, nn.ReLU)]
    composite = NameMapComposite(
        [([convs[0]], ZBox(0.0, 1.0, stabilizer=1e-6)), (convs[1:-1], ZPlus(stabilizer=1e-6, zero_params="bias")),
         ([convs[-1]], Epsilon(1e-6, zero_params="bias")), (relus, Pass())],
        canonizers=[SequentialMergeBatchNorm()])
    x = torch.rand(2, 3, 16, 16, requires_grad=True)
    inputs, z = lrp.forward_inputs(layers, x.detach())
    r_top = z[:, None] * torch.rand(2, 1, *z.shape[1:])
    with composite.context(net) as modified:
        out = modified(x)
        want, = torch.autograd.grad(out, x, grad_outputs=r_top[:, 0])
    got = lrp.lrp_backward(layers, inputs, r_top, lrp.default_rules(len(layers)), eps=1e-6)[:, 0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
