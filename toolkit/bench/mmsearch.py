"""MMSearch-Plus data format and answer judging.

Encryption (official `decrypt_after_load.py`, dataset card of Cie1/MMSearch-Plus): the key is SHA-256 of the
canary string — the repository name "MMSearch-Plus" — repeated to the message length; the ciphertext is the
base64 of plaintext XOR key. Encrypted fields: question, video_url, arxiv_id and every element of the answer list;
images (img_1..img_5) are not encrypted in the released version.

Judging: the paper's GPT-4o judge prompt is unpublished, so the LLM judge here is a SimpleQA-style
CORRECT / INCORRECT / NOT_ATTEMPTED grader; without a judge (or when its reply cannot be parsed) answers are scored
by SQuAD-normalised exact match against any answer alternative, as lmms-eval scores MMSearch end to end.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from pathlib import Path

from PIL import Image

from toolkit.bench.config import CANARY
from toolkit.core.errors import BadInputError
from toolkit.eval.metrics import normalize_answer, token_f1

TEXT_FIELDS = ("question", "video_url", "arxiv_id")
IMAGE_FIELDS = ("img_1", "img_2", "img_3", "img_4", "img_5")


def derive_key(canary: str, length: int) -> bytes:
    digest = hashlib.sha256(canary.encode()).digest()
    return (digest * (length // len(digest) + 1))[:length]


def xor_with_key(data: bytes, canary: str) -> bytes:
    return bytes(a ^ b for a, b in zip(data, derive_key(canary, len(data))))


def encrypt_text(plaintext: str, canary: str = CANARY) -> str:
    return base64.b64encode(xor_with_key(plaintext.encode("utf-8"), canary)).decode("ascii")


def decrypt_text(ciphertext: str, canary: str = CANARY) -> str:
    try:
        return xor_with_key(base64.b64decode(ciphertext, validate=True), canary).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadInputError("a field is not valid ciphertext for this canary",
                            "check --set canary=..., or --set encrypted=false for decrypted data") from None


def map_text_fields(row: dict, transform) -> dict:
    """Apply `transform` to every encrypted field (empty values stay as they are, as upstream)."""
    out = dict(row)
    for name in TEXT_FIELDS:
        if row.get(name):
            out[name] = transform(row[name])
    if row.get("answer"):
        out["answer"] = [transform(a) if a else a for a in row["answer"]]
    return out


def decrypt_row(row: dict, canary: str = CANARY) -> dict:
    return map_text_fields(row, lambda value: decrypt_text(value, canary))


def encrypt_row(row: dict, canary: str = CANARY) -> dict:
    return map_text_fields(row, lambda value: encrypt_text(value, canary))


def load_image(value, base: Path) -> Image.Image | None:
    """An image field as stored: None, a path (relative to the data file), or {"bytes": raw|base64, "path": ...}
    as Hugging Face datasets export images."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        raw = value.get("bytes")
        if raw is None:
            return load_image(value.get("path"), base)
        data = raw if isinstance(raw, bytes) else base64.b64decode(raw)
        return Image.open(io.BytesIO(data)).convert("RGB")
    path = Path(value) if Path(value).is_absolute() else base / value
    if not path.is_file():
        raise BadInputError(f"image not found: {path}")
    return Image.open(path).convert("RGB")


# ---- judging ----

CONTAINMENT_MAX_TOKENS = 10


def exact_match(prediction: str, golds: list[str]) -> bool:
    """Normalised equality with any alternative, or a short prediction (≤ 10 tokens) containing an alternative as
    a contiguous word span ("Paris, France" for "Paris"); a long list of guesses earns nothing."""
    pred = normalize_answer(prediction).split()
    for gold in golds:
        ref = normalize_answer(gold).split()
        if not ref:
            continue
        if pred == ref:
            return True
        if len(pred) <= CONTAINMENT_MAX_TOKENS and any(pred[i:i + len(ref)] == ref
                                                        for i in range(len(pred) - len(ref) + 1)):
            return True
    return False


JUDGE_PROMPT = """You grade answers to search questions. Compare the predicted answer with the gold answers (any \
alternative counts; ignore capitalisation, punctuation and extra detail that does not contradict the gold answer).
Question: {question}
Gold answers: {golds}
Predicted answer: {prediction}
Reply with exactly one word: CORRECT, INCORRECT or NOT_ATTEMPTED."""

_VERDICT = re.compile(r"\b(NOT_ATTEMPTED|INCORRECT|CORRECT)\b")


def judge_prompt(question: str, golds: list[str], prediction: str) -> str:
    return JUDGE_PROMPT.format(question=question, golds=" | ".join(golds), prediction=prediction)


def parse_verdict(reply: str) -> str | None:
    match = _VERDICT.search(reply.upper())
    return match[1] if match else None


def judge_answer(question: str, golds: list[str], prediction: str, ask_judge=None) -> dict:
    """{"correct", "verdict", "judged_by", "f1"}; `ask_judge(prompt) -> reply` or None for exact match only."""
    f1 = token_f1(prediction, [g for g in golds if g])
    if ask_judge is not None:
        verdict = parse_verdict(ask_judge(judge_prompt(question, golds, prediction)))
        if verdict is not None:
            return {"correct": verdict == "CORRECT", "verdict": verdict, "judged_by": "llm", "f1": f1}
    correct = bool(prediction.strip()) and exact_match(prediction, golds)
    return {"correct": correct, "verdict": "CORRECT" if correct else "INCORRECT", "judged_by": "exact-match",
            "f1": f1}
