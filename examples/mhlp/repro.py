"""MHLP repro, part 1: the exact check — a scripted proposer over 8 prompts with a known posterior ∝ p(θ)·L(θ)^β;
part 2: a scripted calibration task — 12 prompts that each answer deterministically (right on a prompt-specific
subset of questions), one training example per MH step as in MHLP; the posterior ensemble's answer frequencies vs the
single best prompt. Part 2 is synthetic (no LLM); repro.sh then runs the issue's smollm2 check and keeps these rows
as "*-synthetic".
"""

import argparse
import json
from pathlib import Path

import numpy as np

from toolkit.prompt import mhlp
from toolkit.prompt.run import uncertainty_row
from toolkit.prompt.scripted import FinitePromptSpace

parser = argparse.ArgumentParser()
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--steps", type=int, default=5000)
parser.add_argument("--chains", type=int, default=4)
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

# ---- part 1: exact MH check
space = FinitePromptSpace.random(8, beta=100.0, seed=0)
samples, rates = [], []
for chain in range(args.chains):
    result = space.sample(args.steps, seed=chain, initial=chain)
    samples += mhlp.thin(result.states, burn_in=100, thinning=1)
    rates.append(result.acceptance_rate)
empirical = mhlp.empirical_distribution(samples, range(8))
tv = mhlp.total_variation(empirical, space.posterior())

# ---- part 2: scripted calibration task (3 classes; prompt k is right on question q with probability skill_k)
rng = np.random.default_rng(1)
n_prompts, n_train, n_test, n_classes, beta = 12, 200, 300, 3, 1.0
skill = rng.uniform(0.35, 0.8, n_prompts)
gold = rng.integers(0, n_classes, n_train + n_test)
right = rng.uniform(size=(n_prompts, n_train + n_test)) < skill[:, None]
wrong_answer = (gold + rng.integers(1, n_classes, size=(n_prompts, n_train + n_test))) % n_classes
answers = np.where(right, gold, wrong_answer)  # a deterministic (greedy) answer table: prompt × question
# the task model's probability of the gold answer substituted into its response: high when it answered it
log_lik = np.where(right, np.log(0.9), np.log(0.1 / (n_classes - 1)))
chain_rng = np.random.default_rng(2)


def propose(state: int, step: int) -> mhlp.Proposal:  # symmetric: any other prompt uniformly
    new = int((state + chain_rng.integers(1, n_prompts)) % n_prompts)
    return mhlp.Proposal(new, 0.0, 0.0)


def log_target(state: int, step: int) -> float:  # uniform prior; one training example per step
    return beta * float(log_lik[state, step % n_train])


chain = mhlp.run_chain(0, propose, log_target, steps=400, rng=chain_rng)
posterior_samples = mhlp.thin(chain.states, burn_in=40, thinning=4)
test = np.arange(n_train, n_train + n_test)
labels = gold[test].tolist()
classes = [str(c) for c in range(n_classes)]
ensemble = np.stack([mhlp.vote_distribution([str(answers[p, q]) for p in posterior_samples], classes) for q in test])
best = int(np.argmax(right[:, :n_train].mean(axis=1)))  # the single best prompt on the training questions
single = np.stack([mhlp.vote_distribution([str(answers[best, q])] * len(posterior_samples), classes) for q in test])
rows = [uncertainty_row("mhlp", ensemble, labels), uncertainty_row("single", single, labels)]
for row in rows:
    row["task"] = "scripted prompt-answer table (synthetic, no LLM)"

results = {"tv_to_target": tv, "tv_steps_per_chain": args.steps, "tv_chains": args.chains,
           "acceptance_rates": rates, "posterior": space.posterior().tolist(), "empirical": empirical.tolist(),
           "calibration_chain_acceptance": chain.acceptance_rate, "n_posterior_samples": len(posterior_samples),
           "rows": rows}
(args.out / "results.json").write_text(json.dumps(results, indent=2))

import matplotlib  # noqa: E402 - only the figure needs it

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(5, 3))
ax.bar(np.arange(8) - 0.2, space.posterior(), 0.4, label="exact posterior")
ax.bar(np.arange(8) + 0.2, empirical, 0.4, label="MH chains")
ax.set_xlabel("prompt"), ax.set_ylabel("probability"), ax.set_title(f"TV = {tv:.4f}"), ax.legend()
fig.tight_layout()
fig.savefig(args.out / "tv.png", dpi=120)

print(f"TV to exact posterior: {tv:.4f} ({args.chains} chains x {args.steps} steps, acceptance "
      f"{np.mean(rates):.2f})")
print(f"{'method':<8} {'accuracy':>8} {'ece':>7} {'brier':>7}")
for row in rows:
    print(f"{row['method']:<8} {row['accuracy']:8.3f} {row['ece']:7.3f} {row['brier']:7.3f}")
