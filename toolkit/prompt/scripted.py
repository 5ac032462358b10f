"""A scripted proposer over a finite prompt set with a known posterior: the exact check of the MH machinery."""

from __future__ import annotations

import numpy as np

from toolkit.prompt.mhlp import ChainResult, Proposal, exact_posterior, run_chain


class FinitePromptSpace:
    """Prompts 0..K-1 with log prior, log likelihood and an asymmetric row-stochastic proposal matrix Q."""

    def __init__(self, log_prior, log_lik, proposal_matrix, beta: float):
        self.log_prior, self.log_lik = np.asarray(log_prior, float), np.asarray(log_lik, float)
        self.q, self.beta = np.asarray(proposal_matrix, float), beta
        if not np.allclose(self.q.sum(axis=1), 1.0):
            raise ValueError("proposal rows must sum to 1")

    @classmethod
    def random(cls, size: int, beta: float, seed: int) -> "FinitePromptSpace":
        rng = np.random.default_rng(seed)
        q = rng.dirichlet(np.ones(size), size=size)
        return cls(rng.normal(0, 1, size), rng.normal(0, 1, size) / beta, q, beta)

    def posterior(self) -> np.ndarray:
        return exact_posterior(self.log_prior, self.log_lik, self.beta)

    def sample(self, steps: int, seed: int, initial: int = 0) -> ChainResult:
        rng = np.random.default_rng(seed)

        def propose(state: int, step: int) -> Proposal:
            new = int(rng.choice(len(self.q), p=self.q[state]))
            return Proposal(new, float(np.log(self.q[state, new])), float(np.log(self.q[new, state])))

        def log_target(state: int, step: int) -> float:
            return float(self.log_prior[state] + self.beta * self.log_lik[state])

        return run_chain(initial, propose, log_target, steps, rng)
