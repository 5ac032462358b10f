"""DeepRAG inference and its baselines as one batched, line-by-line state machine.

Every question is an episode; each round asks the model for the next line of every unfinished episode in one
batch. The policy decides only who chooses to retrieve after a "Follow up:" line:
- deeprag: the model (it writes "Let's search the question in Wikipedia." or "Intermediate answer: ...");
- always: retrieval after every follow-up (IRCoT-style interleaving);
- never: no retrieval (chain of thought from parametric knowledge);
- single: one retrieval for the whole question up front, then no retrieval (single-shot RAG).
Generation stops at each newline, so a stray "Let" inside a sub-question cannot be read as a retrieve decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from toolkit.rag.qa import QAItem
from toolkit.rag.trace import (
    FINAL,
    FOLLOW,
    INTERMEDIATE,
    SEARCH,
    Step,
    Trace,
    extract_final,
    question_prompt,
    render_context,
)

METHODS = ("deeprag", "always", "never", "single")
METHOD_NAMES = {"deeprag": "deeprag", "always": "always-retrieve", "never": "no-retrieval", "single": "single-rag"}
Retrieve = Callable[[QAItem, str], list[str]]  # (question item, query) -> rendered passages


@dataclass
class Episode:
    item: QAItem
    prompt: str
    trace: Trace
    text: str = ""
    expect: str = "step"  # step | decision | answer | final
    subquery: str | None = None
    passages: list[str] | None = None
    done: bool = False
    lines: list[str] = field(default_factory=list)  # raw model lines, for the saved trace


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


class Runner:
    def __init__(self, llm, retrieve: Retrieve, method: str, max_steps: int = 6, max_new_tokens: int = 32,
                 instruction: str | None = None, few_shot: str = ""):
        if method not in METHODS:
            raise ValueError(f"unknown method {method}")
        self.llm, self.retrieve, self.method = llm, retrieve, method
        self.max_steps, self.max_new_tokens = max_steps, max_new_tokens
        self.instruction, self.few_shot = instruction, few_shot

    def start(self, item: QAItem) -> Episode:
        kwargs = {"instruction": self.instruction} if self.instruction is not None else {}
        prompt = question_prompt(item.question, few_shot=self.few_shot, **kwargs)
        trace = Trace(question=item.question)
        if self.method == "single":
            passages = self.retrieve(item, item.question)
            head, question_line = prompt.rsplit("Question:", 1)
            prompt = f"{head}{render_context(passages)}\nQuestion:{question_line}"
            trace.upfront_retrievals = 1
        return Episode(item=item, prompt=prompt, trace=trace)

    def run(self, items: Sequence[QAItem], progress=lambda it, total, description: it) -> list[Episode]:
        episodes = [self.start(item) for item in items]
        max_rounds = 3 * self.max_steps + 2
        for _ in progress(range(max_rounds), max_rounds, f"{self.method} rounds"):
            active = [e for e in episodes if not e.done]
            if not active:
                break
            completions = self.llm.generate([e.prompt + e.text for e in active], max_new_tokens=self.max_new_tokens,
                                            stop=["\n"])
            for episode, completion in zip(active, completions, strict=True):
                self.advance(episode, _first_line(completion.text))
        for episode in episodes:
            if not episode.done:  # out of rounds: the last intermediate answer stands
                self.finish(episode, episode.trace.steps[-1].answer if episode.trace.steps else "")
        return episodes

    def finish(self, episode: Episode, answer: str) -> None:
        episode.trace.final, episode.done = answer, True

    def ask_final(self, episode: Episode) -> None:
        episode.text += f"{FINAL} <answer short>"
        episode.expect = "final"

    def add_step(self, episode: Episode, answer: str) -> None:
        episode.trace.steps.append(Step(episode.subquery or "", answer, episode.passages))
        episode.text += f" {answer}\n" if episode.expect == "answer" else f"{INTERMEDIATE} {answer}\n"
        episode.expect, episode.subquery, episode.passages = "step", None, None

    def search(self, episode: Episode) -> None:
        episode.passages = self.retrieve(episode.item, episode.subquery or episode.item.question)
        episode.text += f"{SEARCH}\n{render_context(episode.passages)}\n{INTERMEDIATE}"
        episode.expect = "answer"

    def advance(self, episode: Episode, line: str) -> None:
        episode.lines.append(line)
        if episode.expect == "final":
            self.finish(episode, extract_final(line))
        elif episode.expect == "answer":
            self.add_step(episode, line)
        elif episode.expect == "decision":
            if line.startswith(SEARCH[:12]):
                self.search(episode)
            elif line.startswith(INTERMEDIATE):
                self.add_step(episode, line[len(INTERMEDIATE):].strip())
            else:  # neither decision: keep the line as a parametric answer, so nothing is retrieved unasked
                episode.trace.malformed.append(line)
                self.add_step(episode, line)
        elif line.startswith(FINAL):
            self.finish(episode, extract_final(line))
        elif line.startswith(FOLLOW) and len(episode.trace.steps) < self.max_steps:
            episode.subquery = line[len(FOLLOW):].strip()
            episode.text += f"{FOLLOW} {episode.subquery}\n"
            if self.method == "deeprag":
                episode.expect = "decision"
            elif self.method == "always":
                self.search(episode)
            else:
                episode.text += INTERMEDIATE
                episode.expect = "answer"
        else:  # malformed line or out of steps: ask for the final answer now
            if not line.startswith(FOLLOW):
                episode.trace.malformed.append(line)
            self.ask_final(episode)


def score(episodes: Sequence[Episode]) -> dict:
    from toolkit.eval.metrics import exact_match, token_f1

    n = max(len(episodes), 1)
    return {"em": sum(exact_match(e.trace.final or "", e.item.answers) for e in episodes) / n,
            "f1": sum(token_f1(e.trace.final or "", e.item.answers) for e in episodes) / n,
            "retrievals_per_question": sum(e.trace.retrievals for e in episodes) / n,
            "questions": len(episodes)}
