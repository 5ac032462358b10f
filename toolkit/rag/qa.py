"""Question sets: HotpotQA (IRCoT `question_text/answers_objects/contexts` and raw `question/answer/context`),
FlashRAG/NQ (`question/golden_answers`) and plain (`question/answer[s]`, optional `decomposition`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import BadInputError, require
from toolkit.rag.retrieval import Passage, passage_from_row


@dataclass
class QAItem:
    id: str
    question: str
    answers: list[str]
    # Gold sub-question templates; "{1}" stands for the first intermediate answer, "{2}" the second, ...
    decomposition: list[str] | None = None
    contexts: list[Passage] = field(default_factory=list)


def _answers(row: dict, line: int) -> list[str]:
    if "answers_objects" in row:
        spans = [span for obj in row["answers_objects"] for span in obj.get("spans", [])]
    elif "golden_answers" in row:
        spans = row["golden_answers"]
    elif "answers" in row:
        spans = row["answers"]
    elif "answer" in row:
        spans = [row["answer"]]
    else:
        raise BadInputError(f"line {line}: no answer field (answers_objects, golden_answers, answers or answer)")
    spans = [str(s) for s in (spans if isinstance(spans, list) else [spans]) if str(s).strip()]
    require(spans, f"line {line}: empty gold answer")
    return spans


def _contexts(row: dict) -> list[Passage]:
    if "contexts" in row:  # IRCoT processed HotpotQA
        return [Passage(str(c.get("id", i)), str(c.get("title", "")), str(c["paragraph_text"]))
                for i, c in enumerate(row["contexts"])]
    if "context" in row and isinstance(row["context"], list):  # raw HotpotQA: [[title, [sentences]], ...]
        return [Passage(f"{row.get('_id', '')}-{i}", str(title), " ".join(sentences))
                for i, (title, sentences) in enumerate(row["context"])]
    return []


def item_from_row(row: dict, line: int) -> QAItem:
    question = row.get("question_text", row.get("question"))
    if not isinstance(question, str) or not question.strip():
        raise BadInputError(f"line {line}: missing or empty question (question_text or question)")
    decomposition = row.get("decomposition")
    if decomposition is not None:
        require(isinstance(decomposition, list) and decomposition and all(isinstance(d, str) for d in decomposition),
                f"line {line}: decomposition must be a non-empty list of sub-question strings")
    return QAItem(id=str(row.get("question_id", row.get("id", row.get("_id", line)))), question=question.strip(),
                  answers=_answers(row, line), decomposition=decomposition, contexts=_contexts(row))


def load_qa(path: str | Path, limit: int | None = None) -> list[QAItem]:
    from toolkit.data.text import read_jsonl

    rows = read_jsonl(path)
    items = []
    for line, row in enumerate(rows, 1):
        try:
            items.append(item_from_row(row, line))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInputError(f"{path}:{line}: malformed QA record ({type(exc).__name__}: {exc})") from None
    return items[:limit] if limit else items


def load_corpus(path: str | Path) -> list[Passage]:
    """A passage JSONL, or a QA file whose questions carry their own paragraphs (HotpotQA/IRCoT `contexts`,
    raw HotpotQA `context`): those paragraphs are pooled, deduplicated by title + text."""
    from toolkit.data.text import read_jsonl

    rows = read_jsonl(path)
    require(rows, f"{path}: the corpus is empty")
    if any(key in rows[0] for key in ("contexts", "context")):
        pooled: dict[tuple[str, str], Passage] = {}
        for line, row in enumerate(rows, 1):
            for passage in item_from_row(row, line).contexts:
                pooled.setdefault((passage.title, passage.text), passage)
        passages = list(pooled.values())
    else:
        passages = [passage_from_row(row, line) for line, row in enumerate(rows, 1)]
    require(passages, f"{path}: no passages found")
    require(all(p.text.strip() for p in passages), f"{path}: a passage has empty text")
    return passages
