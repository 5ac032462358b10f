"""Benign overfitting study: reference curve closed forms, the span trick vs plain GD, interpolation, bad grids."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from toolkit.study.benign_overfit import (
    BenignOverfitConfig,
    forward,
    loss_derivative,
    output_weights,
    reference_error,
    sample_mixture,
    simulate_point,
    train_gd,
)


def test_reference_limits():
    # n‖μ‖² ≫ d: Bayes error Φ(−‖μ‖); the isotropic Φ from the standard normal CDF
    phi = lambda t: 0.5 * (1 + math.erf(t / math.sqrt(2)))
    assert reference_error(2.0, 0, 50) == pytest.approx(phi(-2.0))
    assert reference_error(1.0, 10**9, 50) == pytest.approx(0.5, abs=1e-3)
    assert reference_error(1.5, 300, 50) == pytest.approx(phi(-1.5**2 / math.sqrt(1.5**2 + 6)))


def test_reference_is_mean_difference_classifier_error():
    # Monte-Carlo of w = Σ y_i x_i (whose error the reference curve is) at d ≫ n
    rng = np.random.default_rng(0)
    n, d, mu = 20, 400, 1.5
    errors = []
    for _ in range(400):
        x, y = sample_mixture(n, d, mu, rng)
        w = (y[:, None] * x).sum(0)
        # exact error of a fixed linear rule under Gaussian noise: Φ(−⟨w, μ⟩ / ‖w‖), μ = ‖μ‖ e_1
        errors.append(0.5 * math.erfc(w[0] * mu / np.linalg.norm(w) / math.sqrt(2)))
    assert np.mean(errors) == pytest.approx(reference_error(mu, d, n), abs=0.01)


def test_span_iteration_equals_plain_gd():
    """The (m, n) coefficient iteration reproduces full-dimensional GD on W step for step."""
    config = BenignOverfitConfig(steps=40, width=4, init_scale=1e-3, step_size=0.1)
    rng = np.random.default_rng(1)
    x, y = sample_mixture(12, 30, 1.0, rng)
    fit = train_gd(x, y, config, np.random.default_rng(7))
    a = output_weights(4)
    w = 1e-3 * np.random.default_rng(7).standard_normal((4, 30))
    for _ in range(40):
        pre = x @ w.T
        slope = np.where(pre > 0, 1.0, config.leak)
        margins = y * forward(w, a, x, config.leak)
        w = w - config.step_size * (slope * (loss_derivative(margins, "exponential") * y / 12)[:, None] * a).T @ x
    np.testing.assert_allclose(fit["weights"], w, rtol=1e-10, atol=1e-14)


def test_loss_derivatives():
    m = np.array([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(loss_derivative(m, "exponential"), -np.exp(-m))
    np.testing.assert_allclose(loss_derivative(m, "logistic"), -1 / (1 + np.exp(m)))
    eps = 1e-6
    numeric = (np.log1p(np.exp(-(m + eps))) - np.log1p(np.exp(-(m - eps)))) / (2 * eps)
    np.testing.assert_allclose(loss_derivative(m, "logistic"), numeric, rtol=1e-6)


def test_interpolates_and_tracks_reference_when_overparameterised():
    config = BenignOverfitConfig(steps=1500, n_test=2000, repeats=2)
    point = simulate_point(30, 600, 2.0, config, np.random.default_rng(0))
    assert point["train_error"] == 0.0
    assert point["abs_err"] < 0.06
    assert point["cos_half_final"] > 0.999


def test_student_t_noise_has_unit_variance():
    x, _ = sample_mixture(4000, 50, 1.0, np.random.default_rng(0), noise="student_t", dof=5)
    assert np.var(x[:, 1:]) == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("bad", [{"n_values": [1]}, {"d_values": [0]}, {"mu_norms": [-1.0]}, {"mu_norms": []},
                                 {"width": 3}, {"noise": "student_t", "dof": 2.0}, {"init_scale": 0.1},
                                 {"mu_norms": [float("nan")]}])
def test_impossible_sweeps_rejected(bad):
    with pytest.raises(ValidationError):
        BenignOverfitConfig(**bad)
