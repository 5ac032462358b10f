"""CAVE pieces (toolkit/explain/cave.py, cave_baselines.py) against loops written out by hand."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from toolkit.explain.cave import (
    concept_relevance,
    concept_relevance_maps,
    concept_scores,
    ellipsoid_volume,
    momentum_update,
    nov_contrastive_loss,
    sample_features,
    visible_projection,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_ellipsoid_vertices_lie_on_the_bounding_ellipsoid_with_gradient_normals():
    rng = np.random.default_rng(0)
    mesh = rng.uniform([-2, -1, -0.5], [1, 3, 0.5], (50, 3))
    points, normals = ellipsoid_volume(mesh, 100)
    low, high = mesh.min(0), mesh.max(0)
    centre, axes = (low + high) / 2, (high - low) / 2
    np.testing.assert_allclose((((points - centre) / axes) ** 2).sum(1), 1.0, atol=1e-9)
    gradient = (points - centre) / axes ** 2
    np.testing.assert_allclose(normals, gradient / np.linalg.norm(gradient, axis=1, keepdims=True), atol=1e-9)


def test_visible_projection_keeps_camera_facing_vertices_on_the_object():
    points, normals = ellipsoid_volume(np.array([[-1, -1, -1], [1, 1, 1.0]]), 200)
    pix_to_face = np.zeros((32, 32), dtype=int)  # the whole image is object
    coords, visible = visible_projection(points, normals, np.array([0.0, 0.0, 5.0]), np.ones(3), pix_to_face)
    # camera on +z looking at the origin: a unit sphere's visible cap is z > 1/5
    np.testing.assert_array_equal(visible, points[:, 2] > 0.2)
    pix_to_face[:, :16] = -1  # left half background: vertices projected there are hidden
    _, half = visible_projection(points, normals, np.array([0.0, 0.0, 5.0]), np.ones(3), pix_to_face)
    np.testing.assert_array_equal(half, visible & (coords[:, 0] >= 16))


def test_sample_features_reads_a_cell_exactly_at_its_centre():
    features = torch.randn(2, 3, 4, 4)
    coords = torch.tensor([[[4 * 1 + 2.0, 4 * 3 + 2.0]], [[4 * 0 + 2.0, 4 * 2 + 2.0]]])  # (x, y) in 16 px image
    sampled = sample_features(features, coords, 16)
    torch.testing.assert_close(sampled[0, 0], features[0, :, 3, 1])
    torch.testing.assert_close(sampled[1, 0], features[1, :, 2, 0])


def test_nov_contrastive_loss_matches_a_per_vertex_loop():
    torch.manual_seed(0)
    b, k, c, q, d, t, thr = 2, 5, 3, 4, 6, 0.07, 3.0
    feats = F.normalize(torch.randn(b, k, d), dim=-1)
    bank, clutter = F.normalize(torch.randn(c * k, d), dim=-1), F.normalize(torch.randn(q, d), dim=-1)
    coords = torch.rand(b, k, 2) * 8
    visible = torch.rand(b, k) > 0.3
    labels = torch.tensor([2, 0])
    losses = []
    for i in range(b):
        for v in range(k):
            if not visible[i, v]:
                continue
            logits = torch.cat([bank @ feats[i, v], clutter @ feats[i, v]]) / t
            for u in range(k):
                if u != v and torch.dist(coords[i, v], coords[i, u]) < thr:
                    logits[labels[i] * k + u] = float("-inf")
            losses.append(-torch.log_softmax(logits, 0)[labels[i] * k + v])
    expected = torch.stack(losses).mean()
    torch.testing.assert_close(nov_contrastive_loss(feats, visible, labels, coords, bank, clutter, t, thr), expected)


def test_momentum_update_averages_each_vertex_over_the_batch():
    torch.manual_seed(1)
    k, c, d, m = 3, 2, 4, 0.9
    bank = F.normalize(torch.randn(c * k, d), dim=-1)
    feats = torch.randn(3, k, d)
    visible = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1]], dtype=torch.bool)
    labels = torch.tensor([1, 1, 0])
    expected = bank.clone()
    for row in range(c * k):
        cls, v = divmod(row, k)
        picked = [feats[i, v] for i in range(3) if labels[i] == cls and visible[i, v]]
        if picked:
            expected[row] = F.normalize(m * bank[row] + (1 - m) * torch.stack(picked).mean(0), dim=0)
    momentum_update(bank, feats, visible, labels, m)
    torch.testing.assert_close(bank, expected)


@pytest.mark.parametrize("classifier", ["repo", "paper"])
def test_concept_scores_match_pixel_loops(classifier):
    torch.manual_seed(2)
    n_classes, d = 3, 5
    features = F.normalize(torch.randn(2, d, 3, 4), dim=1)
    concepts = F.normalize(torch.randn(8, d), dim=-1)
    concept_class = torch.tensor([0, 0, 1, 1, 1, 2, -1, -1])
    scores, winner, pixel_score = concept_scores(features, concepts, concept_class, n_classes, classifier)
    per_class_count = [2, 3, 1]
    for b in range(2):
        for c in range(n_classes):
            total = 0.0
            for i in range(3):
                for j in range(4):
                    cos = concepts @ features[b, :, i, j]
                    if classifier == "paper":
                        total += float(cos[concept_class == c].max())
                    elif concept_class[int(cos.argmax())] == c:
                        total += float(cos.max()) / 2 + 0.5
            expected = total if classifier == "paper" else total / per_class_count[c]
            assert float(scores[b, c]) == pytest.approx(expected, abs=1e-5)


def _relevance_case():
    torch.manual_seed(5)
    features = F.normalize(torch.randn(2, 5, 4, 4), dim=1)
    concepts = F.normalize(torch.randn(7, 5), dim=-1)
    concept_class = torch.tensor([0, 0, 0, 1, 1, 1, -1])
    cos = torch.einsum("bdhw,md->bmhw", features, concepts)
    return features, concepts, concept_class, cos, torch.tensor([0, 1])


@pytest.mark.parametrize("classifier", ["repo", "paper"])
def test_concept_relevance_tends_to_the_class_score_as_the_temperature_goes_to_zero(classifier):
    features, concepts, concept_class, cos, labels = _relevance_case()
    scores, _, _ = concept_scores(features, concepts, concept_class, 2, classifier)
    relevance = concept_relevance(cos, concept_class, labels, classifier, 1e-4)
    for b in range(2):
        expected = float(scores[b, labels[b]])
        if classifier == "paper":  # the relevance keeps the positive part of each cell's best cosine
            own = cos[b, concept_class == labels[b]].amax(0)
            expected = float(own.clamp(min=0).sum())
        assert float(relevance[b].sum()) == pytest.approx(expected, abs=1e-4)


def test_concept_relevance_is_the_soft_share_written_out_per_cell():
    _, _, concept_class, cos, labels = _relevance_case()
    relevance = concept_relevance(cos, concept_class, labels, "repo", 0.5)
    b, i, j = 1, 2, 3
    weights = torch.exp(cos[b, :, i, j] / 0.5)
    for slot, h in enumerate([3, 4, 5]):
        expected = weights[h] / weights.sum() * (cos[b, h, i, j] / 2 + 0.5) / 3
        assert float(relevance[b, slot, i, j]) == pytest.approx(float(expected), abs=1e-6)


@pytest.mark.parametrize("sigma", [0.0, 3.0])
def test_relevance_maps_conserve_each_cells_relevance_and_match_a_pixel_loop(sigma):
    torch.manual_seed(6)
    relevance = torch.rand(1, 2, 4, 4)
    maps = concept_relevance_maps(relevance, 16, sigma)
    torch.testing.assert_close(maps.sum((2, 3)), relevance.sum((2, 3)))
    expected = torch.zeros(16, 16, dtype=torch.float64)
    for a in range(4):
        for c in range(4):
            spread = torch.zeros(16, 16, dtype=torch.float64)
            for y in range(16):
                for x in range(16):
                    if sigma:
                        spread[y, x] = np.exp(-((y + 0.5 - (a + 0.5) * 4) ** 2 + (x + 0.5 - (c + 0.5) * 4) ** 2)
                                              / (2 * sigma ** 2))
                    else:
                        spread[y, x] = float(y // 4 == a and x // 4 == c)
            expected += float(relevance[0, 1, a, c]) * spread / spread.sum()
    torch.testing.assert_close(maps[0, 1].double(), expected, atol=1e-5, rtol=1e-5)


def test_grad_cam_equals_the_weighted_activation_sum_of_a_linear_head():
    from toolkit.explain.cave_baselines import Cnn2d, grad_cam

    torch.manual_seed(3)
    model = Cnn2d(4, 3).eval()
    images = torch.rand(2, 3, 16, 16)
    labels = torch.tensor([1, 2])
    cam = grad_cam(model, images, labels)
    acts = model.activations(images).detach()
    # for a linear head on mean-pooled activations, the gradient is W[y] / (h w) at every position
    weights = model.head.weight[labels].detach() / (acts.shape[2] * acts.shape[3])
    expected = F.relu((weights[:, :, None, None] * acts).sum(1, keepdim=True))
    torch.testing.assert_close(cam, F.interpolate(expected, size=(16, 16), mode="bilinear", align_corners=False))


def test_nmf_coefficients_recover_a_known_non_negative_mix():
    from toolkit.explain.cave_baselines import nmf_coefficients

    rng = np.random.default_rng(4)
    dictionary = rng.random((3, 6))
    coefficients = rng.random((5, 3))
    np.testing.assert_allclose(nmf_coefficients(coefficients @ dictionary, dictionary), coefficients, atol=1e-8)
