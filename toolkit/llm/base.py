"""The interface every LLM-in-the-loop technique uses (DeepRAG, MHLP, TokUR, the benchmarks).

- `generate(prompts, ...)` -> completions (text, and token log-probs when the backend has them)
- `score(prompts, continuations, chat=False)` -> log-probabilities of *given* continuation text after each prompt
  (with chat=True: as the assistant's reply to the prompt as a user turn, for instruct models)
- `logits(...)` only where the backend holds the model (local HF)
A backend lists what it can do in `capabilities`; `require()` turns a missing one into a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from toolkit.core.errors import ResourceError


@dataclass
class Completion:
    text: str
    token_logprobs: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass
class ScoredText:
    """Log-probabilities of a continuation's tokens given its prompt."""

    logprob: float
    token_logprobs: list[float]
    tokens: list[str]

    @property
    def mean_logprob(self) -> float:
        return self.logprob / max(len(self.token_logprobs), 1)


class LLM:
    name: str = "llm"
    capabilities: frozenset[str] = frozenset()
    # requests a caller may have in flight on this backend at once: 1 for a model held in this process (one forward
    # at a time); a server backend takes the command's `concurrency`
    concurrency: int = 1

    def require(self, capability: str, purpose: str) -> None:
        if capability not in self.capabilities:
            raise ResourceError(f"backend '{self.name}' cannot {capability.replace('_', ' ')}, which {purpose} needs",
                                "use a local model or a server that returns log-probs of supplied text (vLLM)")

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                 stop: Sequence[str] | None = None, seed: int = 0, chat: bool = False) -> list[Completion]:
        raise ResourceError(f"backend '{self.name}' cannot generate")

    def score(self, prompts: Sequence[str], continuations: Sequence[str], chat: bool = False) -> list[ScoredText]:
        """`chat=True` scores each continuation as the assistant's reply to the prompt sent as a user turn, the
        same formatting `generate(..., chat=True)` uses."""
        self.require("score", "scoring supplied text")
        return []

    def score_choices(self, prompts: Sequence[str], choices: Sequence[str], chat: bool = False) -> list[list[float]]:
        """log p(choice | prompt) for every prompt (rows) and every choice (columns), as `score` defines it; local
        backends override it with a faster path that gives the same numbers."""
        flat = self.score([p for p in prompts for _ in choices], [c for _ in prompts for c in choices], chat=chat)
        return [[s.logprob for s in flat[i * len(choices):(i + 1) * len(choices)]] for i in range(len(prompts))]

    def close(self) -> None:
        """Release resources; backends without any keep this."""


def truncate_at_stop(text: str, stop: Sequence[str] | None) -> str:
    cut = len(text)
    for marker in stop or ():
        position = text.find(marker)
        if position != -1:
            cut = min(cut, position)
    return text[:cut]
