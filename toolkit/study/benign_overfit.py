"""Benign overfitting of gradient descent in leaky-ReLU two-layer networks (`iclrkit study benign-overfit`).

Paper: I. Hashimoto, "Directional Convergence, Benign Overfitting of Gradient Descent in leaky ReLU two-layer
Neural Networks" (ICLR 2026), https://arxiv.org/abs/2505.16204. The paper is theory only (no official code); this
is a simulation of its setting checked against the reference curve err ≈ Φ(−‖μ‖² / √(‖μ‖² + d/n)) for isotropic
noise (our reading of its phase transition at n‖μ‖² ≍ d: Bayes error Φ(−‖μ‖) when n‖μ‖² ≫ d, Φ(−√(n‖μ‖⁴/d))
when n‖μ‖² ≪ d).

Setting: x = yμ + z with y = ±1 (no label flipping), z ~ N(0, I_d) or a unit-variance Student-t; the network
f(x) = Σ_j a_j φ(⟨w_j, x⟩) with φ(t) = max(t, γt) and a_j = ±1/√m fixed (half each); only W is trained, by
full-batch gradient descent on the exponential (or logistic) loss from an initialisation much smaller than η.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import Count
from toolkit.core.records import write_json


class BenignOverfitConfig(BaseConfig):
    """Grid of (n, d, ‖μ‖); every point trains one network per repeat and measures train/test error."""

    n_values: list[Annotated[int, Field(ge=2)]] = Field([50], min_length=1, description="Training-set sizes n.",
                                json_schema_extra={"flag": "--n", "style": "comma"})
    d_values: list[Count] = Field([50, 200, 1000, 3000], min_length=1, description="Dimensions d.",
                                json_schema_extra={"flag": "--d", "style": "comma"})
    mu_norms: list[Annotated[float, Field(gt=0)]] = Field([1.0, 2.0, 3.0], min_length=1, description="Signal strengths ‖μ‖.",
                                  json_schema_extra={"flag": "--mu", "style": "comma"})
    width: int = Field(10, ge=2, description="Hidden width m (even: half the a_j are +1/√m, half −1/√m).")
    leak: float = Field(0.1, gt=0, lt=1, description="Leaky-ReLU slope γ.")
    step_size: float = Field(0.05, gt=0, description="GD step η.")
    init_scale: float = Field(1e-6, ge=0, description="Std of the initial weights; must be ≪ η.")
    steps: int = Field(3000, ge=2, description="GD steps (full batch).")
    loss: Literal["exponential", "logistic"] = Field("exponential", description="Paper: exponential.")
    noise: Literal["gaussian", "student_t"] = Field("gaussian", description="Noise z; Student-t is unit-variance.")
    dof: float = Field(5.0, description="Student-t degrees of freedom ν (> 2 for a finite variance).")
    n_test: int = Field(4000, ge=1, description="Fresh test points per grid point.")
    repeats: int = Field(1, ge=1, description="Training sets per grid point (errors averaged).")

    @model_validator(mode="after")
    def _check(self) -> BenignOverfitConfig:
        if any(n < 2 for n in self.n_values):
            raise ValueError("every n must be at least 2")
        if any(d < 1 for d in self.d_values):
            raise ValueError("every d must be at least 1")
        if any(not math.isfinite(mu) or mu <= 0 for mu in self.mu_norms):
            raise ValueError("every ‖μ‖ must be a positive finite number")
        if self.width % 2:
            raise ValueError(f"width {self.width} must be even (half the output weights are +1/√m, half −1/√m)")
        if self.noise == "student_t" and not self.dof > 2:
            raise ValueError(f"Student-t noise needs dof > 2 for a finite variance, got {self.dof}")
        if self.init_scale >= self.step_size:
            raise ValueError("init_scale must be much smaller than step_size (the paper's small-init regime)")
        return self


def reference_error(mu_norm: float, d: int, n: int) -> float:
    """Φ(−‖μ‖² / √(‖μ‖² + d/n)) for isotropic unit-variance noise."""
    return 0.5 * math.erfc(mu_norm**2 / math.sqrt(mu_norm**2 + d / n) / math.sqrt(2))


def sample_mixture(n: int, d: int, mu_norm: float, rng: np.random.Generator, noise: str = "gaussian",
                   dof: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """x = yμ + z with μ = ‖μ‖·e_1 (w.l.o.g. for isotropic z) and balanced random labels y = ±1."""
    y = rng.choice([-1.0, 1.0], size=n)
    if noise == "gaussian":
        z = rng.standard_normal((n, d))
    else:
        z = rng.standard_t(dof, size=(n, d)) * math.sqrt((dof - 2) / dof)
    x = z
    x[:, 0] += y * mu_norm
    return x, y


def output_weights(width: int) -> np.ndarray:
    return np.concatenate([np.ones(width // 2), -np.ones(width // 2)]) / math.sqrt(width)


def forward(weights: np.ndarray, a: np.ndarray, x: np.ndarray, leak: float) -> np.ndarray:
    pre = x @ weights.T
    return np.where(pre > 0, pre, leak * pre) @ a


def loss_derivative(margins: np.ndarray, loss: str) -> np.ndarray:
    """dℓ/dm at the margins m = y·f(x): −e^{−m} (exponential) or −σ(−m) (logistic)."""
    if loss == "exponential":
        return -np.exp(-margins)
    return -0.5 * (1 - np.tanh(margins / 2))


def train_gd(x: np.ndarray, y: np.ndarray, config: BenignOverfitConfig, rng: np.random.Generator) -> dict:
    """Full-batch GD on W only; returns W and the cosine between W_{T/2} and W_T (directional convergence).

    Every gradient is a combination of the training inputs, so W_t = W_0 + C_t X exactly; iterating on the
    (m, n) coefficients C with the Gram matrix X Xᵀ costs m·n² per step instead of m·n·d (same iterates)."""
    n, d = x.shape
    a = output_weights(config.width)
    init = config.init_scale * rng.standard_normal((config.width, d))
    gram, pre_init = x @ x.T, x @ init.T  # (n, n), (n, m)
    coeffs = np.zeros((config.width, n))
    half = None
    for step in range(1, config.steps + 1):
        pre = pre_init + gram @ coeffs.T
        slope = np.where(pre > 0, 1.0, config.leak)
        margins = y * ((pre * slope) @ a)
        coef = loss_derivative(margins, config.loss) * y / n  # dL/df_i
        coeffs = coeffs - config.step_size * (slope * coef[:, None] * a[None, :]).T
        if step == config.steps // 2:
            half = coeffs.copy()
    if not np.all(np.isfinite(coeffs)):
        from toolkit.core.errors import RunError
        raise RunError("gradient descent diverged (non-finite weights)", "lower step_size")
    weights = init + coeffs @ x
    return {"weights": weights, "a": a, "cos_half": _cosine(init + half @ x, weights)}


def _cosine(u: np.ndarray, v: np.ndarray) -> float:
    return float((u * v).sum() / (np.linalg.norm(u) * np.linalg.norm(v)))


def error_rate(weights, a, x, y, leak) -> float:
    return float(np.mean(np.sign(forward(weights, a, x, leak)) != y))


def simulate_point(n: int, d: int, mu_norm: float, config: BenignOverfitConfig, rng: np.random.Generator) -> dict:
    train_errors, test_errors, cosines = [], [], []
    for _ in range(config.repeats):
        x, y = sample_mixture(n, d, mu_norm, rng, config.noise, config.dof)
        fit = train_gd(x, y, config, rng)
        xt, yt = sample_mixture(config.n_test, d, mu_norm, rng, config.noise, config.dof)
        train_errors.append(error_rate(fit["weights"], fit["a"], x, y, config.leak))
        test_errors.append(error_rate(fit["weights"], fit["a"], xt, yt, config.leak))
        cosines.append(fit["cos_half"])
    reference = reference_error(mu_norm, d, n)
    test = float(np.mean(test_errors))
    return {"n": n, "d": d, "mu_norm": mu_norm, "signal_ratio": n * mu_norm**2 / d,
            "train_error": float(np.max(train_errors)), "test_error": test, "reference": reference,
            "abs_err": abs(test - reference), "bayes_error": reference_error(mu_norm, 0, n),
            "cos_half_final": float(np.min(cosines))}


def plot(points: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for n in sorted({p["n"] for p in points}):
        for mu in sorted({p["mu_norm"] for p in points}):
            row = sorted((p for p in points if p["n"] == n and p["mu_norm"] == mu), key=lambda p: p["d"])
            ds = [p["d"] for p in row]
            line = left.plot(ds, [p["test_error"] for p in row], "o", label=f"n={n}, ‖μ‖={mu:g} (GD)")
            left.plot(ds, [p["reference"] for p in row], "-", color=line[0].get_color())
    left.set(xscale="log", xlabel="d", ylabel="test error", title="simulation (dots) vs reference (lines)")
    left.legend(fontsize=6)
    ratios = np.array([p["signal_ratio"] for p in points])
    mus = np.array([p["mu_norm"] for p in points])
    scatter = right.scatter(ratios, mus, c=[p["test_error"] for p in points], cmap="viridis", s=120,
                            marker="s", vmin=0, vmax=0.5)
    right.axvline(1.0, color="red", linestyle="--", label="n‖μ‖² = d")
    right.set(xscale="log", xlabel="n‖μ‖² / d", ylabel="‖μ‖", title="phase diagram: test error")
    right.legend(fontsize=7)
    fig.colorbar(scatter, ax=right)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(config: BenignOverfitConfig, ctx) -> dict:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # tiny matrices: BLAS threads only fight over the shared cores
        return _run(config, ctx)


def _run(config: BenignOverfitConfig, ctx) -> dict:
    rng = np.random.default_rng(ctx.seed)
    grid = [(n, d, mu) for n in config.n_values for d in config.d_values for mu in config.mu_norms]
    points = [simulate_point(n, d, mu, config, rng) for n, d, mu in ctx.progress(grid, len(grid), "grid")]
    summary = {"points": len(points), "max_abs_err_vs_reference": max(p["abs_err"] for p in points),
               "max_train_error": max(p["train_error"] for p in points),
               "min_cos_half_final": min(p["cos_half_final"] for p in points),
               "overparameterised_points": sum(p["d"] >= p["n"] for p in points)}
    ctx.metrics.update(summary)
    if ctx.out is not None:
        write_json(ctx.path("points.json"), {"summary": summary, "points": points})
        plot(points, ctx.path("phase_diagram.png"))
    return {"summary": summary, "points": points}
