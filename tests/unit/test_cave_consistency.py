"""3D-C metric (toolkit/explain/consistency.py) against hand-computed values and brute-force references."""

import itertools

import numpy as np
import pytest

from toolkit.explain.consistency import (
    concept_consistency,
    consistency_3d,
    mean_score,
    object_masks,
    project_to_faces,
)


def test_project_to_faces_sums_positive_attribution_per_face():
    pix_to_face = np.array([[0, 0, -1], [2, 1, 2]])
    attribution = np.array([[1.0, 2.0, 5.0], [-3.0, 4.0, 0.5]])
    np.testing.assert_allclose(project_to_faces(attribution, pix_to_face, 4), [3.0, 4.0, 0.5, 0.0])


def brute_force_3dc(omegas):
    """The formula written out with explicit loops over ordered pairs x != x'."""
    normalised = [o / o.sum() for o in omegas if o.sum() > 0]
    n = len(normalised)
    total = sum(np.abs(a - b).sum() for a, b in itertools.permutations(normalised, 2))
    return 1 - 0.5 * total / (n * (n - 1))


def test_consistency_matches_brute_force_on_random_distributions():
    rng = np.random.default_rng(0)
    omegas = rng.random((7, 30)) * (rng.random((7, 30)) < 0.4)
    assert consistency_3d(omegas) == pytest.approx(brute_force_3dc(omegas))


def test_identical_attributions_across_poses_score_one_and_disjoint_faces_zero():
    same = np.tile(np.array([0.0, 2.0, 1.0, 0.0]), (5, 1)) * np.arange(1, 6)[:, None]  # scale does not matter
    assert consistency_3d(same) == pytest.approx(1.0)
    disjoint = np.eye(4) * 3
    assert consistency_3d(disjoint) == pytest.approx(0.0)
    assert np.isnan(consistency_3d(np.zeros((3, 4))))  # no image carries mass: undefined, not 1


def test_perfectly_consistent_explanation_through_pixels_is_one_and_resolution_invariant():
    """A concept that always lights the same faces, seen at different poses and resolutions, scores 1."""
    rng = np.random.default_rng(1)
    maps, faces = [], []
    for size in (8, 16):
        for _ in range(4):
            pix_to_face = rng.integers(-1, 6, (size, size))
            maps.append(np.isin(pix_to_face, [1, 3]).astype(float))
            faces.append(pix_to_face)
    # face 1 and 3 carry their pixel counts, which differ by pose: normalise the map per face to isolate the set
    flat = [m / np.maximum(np.bincount(f[f >= 0], minlength=6)[np.maximum(f, 0)], 1) for m, f in zip(maps, faces)]
    omegas = np.stack([project_to_faces(m, f, 6) for m, f in zip(flat, faces)])
    assert consistency_3d(omegas) == pytest.approx(1.0)


def test_random_maps_score_near_the_visibility_chance_level():
    """Random attributions are as consistent as the uniform object mask (chance), far below 1."""
    rng = np.random.default_rng(2)
    n, size, n_faces = 30, 32, 40
    pix_to_face = np.full((n, size, size), -1)
    for i in range(n):  # each 'pose' shows a random contiguous window of faces
        start = rng.integers(0, n_faces - 10)
        pix_to_face[i, 8:24, 8:24] = rng.integers(start, start + 10, (16, 16))
    labels = np.zeros(n, dtype=int)
    random_maps = rng.random((n, 3, size, size))
    random_score = mean_score(concept_consistency(random_maps, pix_to_face, labels, [n_faces]))
    chance = mean_score(concept_consistency(object_masks(pix_to_face), pix_to_face, labels, [n_faces]))
    assert random_score == pytest.approx(chance, abs=0.05)
    assert random_score < 0.5


def test_concept_consistency_rejects_mismatched_resolution_and_nan():
    from toolkit.core.errors import BadInputError

    pix_to_face = np.zeros((2, 4, 4), dtype=int)
    with pytest.raises(BadInputError, match="resize"):
        concept_consistency(np.ones((2, 1, 8, 8)), pix_to_face, np.zeros(2, int), [1])
    with pytest.raises(BadInputError, match="NaN"):
        concept_consistency(np.full((2, 1, 4, 4), np.nan), pix_to_face, np.zeros(2, int), [1])
