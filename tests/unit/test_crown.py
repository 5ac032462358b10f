"""CROWN/IBP bounds on boxes and on Omega_m against brute force (subset x vertex enumeration, sampling)."""

import itertools

import pytest
import torch
from torch import nn

from toolkit.explain.crown import (
    box_domains,
    cardinality_domains,
    concretize_upper,
    epsilon_box,
    margin_spec,
    spec_bounds,
    top_m_sum,
)
from toolkit.explain.net import AffineNet, to_affine_net

pytestmark = pytest.mark.usefixtures("one_thread")


def mlp(seed, widths=(6, 5, 4, 3), shape=None):
    torch.manual_seed(seed)
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return to_affine_net(nn.Sequential(*layers[:-1]), shape or (widths[0],))


def subset_points(x0, lower, upper, feature, free, candidate, m, samples, generator):
    """Random points of Omega_m: every subset of <= m candidates, random points and vertices of its box."""
    cands = candidate.nonzero().flatten().tolist()
    points = []
    for size in range(m + 1):
        for subset in itertools.combinations(cands, size):
            moving = free.clone()
            moving[list(subset)] = True
            coord = moving[feature]
            noise = torch.rand(samples, len(x0), generator=generator, dtype=torch.float64)
            corner = torch.randint(0, 2, (samples, len(x0)), generator=generator).double()
            for draw in (noise, corner):
                points.append(torch.where(coord, lower + draw * (upper - lower), x0))
    return torch.cat(points)


def test_top_m_sum_matches_enumeration():
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(4, 3, 7, generator=generator, dtype=torch.float64)
    m = torch.tensor([0, 1, 3, 7])
    got = top_m_sum(values, m)
    for b in range(4):
        for s in range(3):
            best = max((sum(values[b, s, list(c)]) for c in itertools.combinations(range(7), int(m[b]))), default=0.0)
            assert got[b, s] == pytest.approx(float(best), abs=1e-12)


@pytest.mark.parametrize("channels", [1, 2])
def test_linear_concretization_equals_subset_vertex_enumeration(channels):
    """Omega_m maximum of a linear form (pixels move with all their channels) = max over subsets and vertices."""
    generator = torch.Generator().manual_seed(channels)
    pixels = 5
    net = AffineNet([torch.randn(3, channels * pixels, generator=generator, dtype=torch.float64)],
                    [torch.randn(3, generator=generator, dtype=torch.float64)], (channels, 1, pixels))
    x0 = torch.rand(channels * pixels, generator=generator, dtype=torch.float64)
    lower, upper = epsilon_box(x0, 0.3)
    free = torch.tensor([True, False, False, False, False])
    domain = cardinality_domains(net, x0, lower, upper, free, torch.arange(0, 5))
    got = concretize_upper(domain, net.weights[0].expand(5, -1, -1), net.biases[0].expand(5, -1))
    feature = net.feature_of_input()
    for m in range(5):
        best = torch.full((3,), -float("inf"), dtype=torch.float64)
        for subset in itertools.chain.from_iterable(itertools.combinations(range(1, 5), k) for k in range(m + 1)):
            moving = free.clone()
            moving[list(subset)] = True
            coords = moving[feature].nonzero().flatten().tolist()
            for corner in itertools.product((0, 1), repeat=len(coords)):
                point = x0.clone()
                for coord, side in zip(coords, corner):
                    point[coord] = upper[coord] if side else lower[coord]
                best = torch.maximum(best, net(point))
        assert torch.allclose(got[m], best, atol=1e-12)


def test_first_layer_bounds_on_omega_m_are_exact():
    net = mlp(1)
    x0 = torch.rand(6, dtype=torch.float64)
    lower, upper = epsilon_box(x0, 0.25)
    free = torch.zeros(6, dtype=torch.bool)
    domain = cardinality_domains(net, x0, lower, upper, free, torch.tensor([2]))
    lo, hi = spec_bounds(net, domain, margin_spec(3, 0)).pre_bounds[0]
    corners = []  # all vertices of every 2-subset box (linear: the extremes are there)
    for subset in itertools.combinations(range(6), 2):
        for corner in itertools.product((0, 1), repeat=2):
            point = x0.clone()
            for coord, side in zip(subset, corner):
                point[coord] = upper[coord] if side else lower[coord]
            corners.append(point)
    pre = torch.stack(corners) @ net.weights[0].T + net.biases[0]
    assert torch.allclose(hi[0], pre.amax(0), atol=1e-12) and torch.allclose(lo[0], pre.amin(0), atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounds_are_sound_on_omega_m_and_crown_beats_ibp(seed):
    net = mlp(seed)
    generator = torch.Generator().manual_seed(seed)
    x0 = torch.rand(6, generator=generator, dtype=torch.float64)
    lower, upper = epsilon_box(x0, 0.2)
    free = torch.tensor([True, False, False, True, False, False])
    spec = margin_spec(3, int(net(x0).argmax()))
    ms = torch.arange(0, 5)
    domain = cardinality_domains(net, x0, lower, upper, free, ms)
    crown = spec_bounds(net, domain, spec, "crown")
    ibp = spec_bounds(net, domain, spec, "ibp")
    assert bool((crown.upper <= ibp.upper + 1e-9).all())
    for row, m in enumerate(ms.tolist()):
        points = subset_points(x0, lower, upper, net.feature_of_input(), free, ~free, m, 300, generator)
        values = net(points) @ spec.T
        assert bool((values <= crown.upper[row] + 1e-9).all())
        linear = points @ crown.coeffs[row].T + crown.offset[row]  # the linear bound itself holds pointwise
        assert bool((values <= linear + 1e-9).all())


def test_conv_bn_avgpool_network_bounds_sound_and_tighter_than_ibp():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.AvgPool2d(2),
                          nn.Flatten(), nn.Linear(12, 6), nn.ReLU(), nn.Linear(6, 4))
    model[1].running_mean.uniform_(-0.2, 0.2)
    model[1].running_var.uniform_(0.5, 1.5)
    model.eval()
    reference = model.double()
    net = to_affine_net(model, (2, 4, 4))
    x = torch.rand(5, 2, 4, 4, dtype=torch.float64)
    assert torch.allclose(net(x.reshape(5, -1)), reference(x), atol=1e-10)
    x0 = x[0].reshape(-1)
    lower, upper = epsilon_box(x0, 0.1)
    free = torch.rand(3, 16) < 0.5
    domain = box_domains(net, x0, lower, upper, free)
    spec = margin_spec(4, 1)
    crown, ibp = spec_bounds(net, domain, spec, "crown"), spec_bounds(net, domain, spec, "ibp")
    assert bool((crown.upper <= ibp.upper + 1e-9).all())
    for row in range(3):
        coord = free[row][net.feature_of_input()]
        draw = torch.rand(2000, 32, dtype=torch.float64)
        points = torch.where(coord, lower + draw * (upper - lower), x0)
        assert bool(((net(points) @ spec.T) <= crown.upper[row] + 1e-9).all())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_onnx_import_matches_torch(tmp_path):
    from toolkit.explain.net import load_net

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32, 5), nn.ReLU(),
                          nn.Linear(5, 3)).eval()
    path = tmp_path / "net.onnx"
    torch.onnx.export(model, (torch.zeros(1, 1, 4, 4),), str(path), dynamo=False)
    net, _ = load_net(str(path))
    x = torch.rand(4, 1, 4, 4)
    assert torch.allclose(net(x.reshape(4, -1).double()).float(), model(x), atol=1e-5)
