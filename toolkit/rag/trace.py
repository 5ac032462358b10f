"""The DeepRAG step format, its rendering and a strict, total parser.

A trajectory after the prompt is a sequence of lines:
    Follow up: <sub-question>
    Let's search the question in Wikipedia.          (retrieve decision; absent for a parametric answer)
    Context: [1] <passage> [2] <passage> ...         (retrieved text: data, never trained on)
    Intermediate answer: <answer>
    ...
    So the final answer is: <answer short><answer></answer short>
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

FOLLOW = "Follow up:"
SEARCH = "Let's search the question in Wikipedia."
CONTEXT = "Context:"
INTERMEDIATE = "Intermediate answer:"
FINAL = "So the final answer is:"

INSTRUCTION = (
    "Answer the question by decomposing it into simple sub-questions. Write each one after \"Follow up:\" and its "
    "answer after \"Intermediate answer:\". For each sub-question decide whether you know the answer; if not, write "
    f"\"{SEARCH}\" and answer from the retrieved context. End with \"{FINAL} <answer short>ANSWER</answer short>\".\n"
)


@dataclass
class Step:
    subquery: str
    answer: str
    retrieved: list[str] | None = None  # rendered passages when this step retrieved, else None (parametric)
    # The answer the opposite decision produced during synthesis (the rejected side of a calibration pair)
    alternative: str | None = None

    @property
    def retrieves(self) -> bool:
        return self.retrieved is not None


@dataclass
class Trace:
    question: str
    steps: list[Step] = field(default_factory=list)
    final: str | None = None
    malformed: list[str] = field(default_factory=list)  # lines the parser could not place
    upfront_retrievals: int = 0  # single-shot RAG retrieves once for the whole question before any step

    @property
    def retrievals(self) -> int:
        return self.upfront_retrievals + sum(step.retrieves for step in self.steps)

    def to_dict(self) -> dict:
        return {**asdict(self), "retrievals": self.retrievals}


def question_prompt(question: str, instruction: str = INSTRUCTION, few_shot: str = "") -> str:
    return f"{instruction}{few_shot}Question: {question}\n"


def render_context(passages: list[str]) -> str:
    return f"{CONTEXT} " + " ".join(f"[{i}] {' '.join(p.split())}" for i, p in enumerate(passages, 1))


def render_final(answer: str) -> str:
    return f"{FINAL} <answer short>{answer}</answer short>"


def render_step(step: Step) -> str:
    lines = [f"{FOLLOW} {step.subquery}"]
    if step.retrieves:
        lines += [SEARCH, render_context(step.retrieved)]
    lines.append(f"{INTERMEDIATE} {step.answer}")
    return "\n".join(lines) + "\n"


def render_trace(trace: Trace) -> str:
    """The trajectory text after the question prompt (what the model is trained to produce)."""
    body = "".join(render_step(step) for step in trace.steps)
    return body + (render_final(trace.final) + "\n" if trace.final is not None else "")


_SHORT = re.compile(r"<answer short>(.*?)(?:</answer short>|$)", re.S)


def extract_final(text: str) -> str:
    """The short answer from a final line: inside <answer short> when present, else the text after the marker."""
    text = text.split(FINAL, 1)[1] if FINAL in text else text
    match = _SHORT.search(text)
    answer = match.group(1) if match else re.sub(r"</?answer (?:long|short)>", " ", text)
    return " ".join(answer.split()).strip(" .")


def parse_trace(question: str, text: str) -> Trace:
    """Parse a trajectory; never raises. Lines out of place go to `malformed`, a step without an answer is dropped,
    context lines count as retrieval only after the search line."""
    trace = Trace(question=question)
    subquery: str | None = None
    retrieved: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(FOLLOW):
            subquery, retrieved = line[len(FOLLOW):].strip(), None
        elif line.startswith(SEARCH[:12]) and subquery is not None:
            retrieved = []
        elif line.startswith(CONTEXT) and retrieved is not None:
            retrieved = [p.strip() for p in re.split(r"\[\d+\]", line[len(CONTEXT):]) if p.strip()]
        elif line.startswith(INTERMEDIATE) and subquery is not None:
            trace.steps.append(Step(subquery, line[len(INTERMEDIATE):].strip(), retrieved))
            subquery, retrieved = None, None
        elif line.startswith(FINAL):
            trace.final = extract_final(line)
            break
        else:
            trace.malformed.append(line)
    return trace
