"""VideoMathQA scoring and prompts, following the official lmms-eval task (`lmms_eval/tasks/videomathqa/`).

- `extract_characters_regex`: strip answer prefixes; more than 10 words without any A–E -> ""; else the first
  A–E. The upstream prefix list lacks two commas (it glues "The best option is"+"The correct option is" and
  "Best answer:"+"Best option:" into two prefixes that never occur); here all eight prefixes are separate.
- MCQ accuracy (%) by length × category; multi-binary: a question counts only if all its pairs are right.
- CoT: an LLM maps the free text to a letter (`cot_postprocess.py`); on failure a random *wrong* letter.
- Step score: an LLM judge with the official rubric answers `SCORE_CARD: {...}`; an unparsable reply scores 0
  with critique "Error".
"""

from __future__ import annotations

import ast
import json
import re
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

LETTERS = "ABCDE"
VIDEO_LENGTHS = ("short", "medium", "long")
CATEGORIES = ("Geometry Angle", "Geometry Area", "Geometry Length", "Chart", "Statistics", "Arithmetic",
              "Topology", "Graph Theory", "Counting", "Puzzle")
ANSWER_PREFIXES = ("The best answer is", "The correct answer is", "The answer is", "The answer",
                   "The best option is", "The correct option is", "Best answer:", "Best option:")

SUBTITLE_HEADER = "This video's subtitles are listed below: \n"
NO_SUBTITLES = "No subtitles available"


def letters_for(n_options: int) -> str:
    return "A or B" if n_options == 2 else "A, B, C, D or E"


def post_prompt(n_options: int, cot: bool) -> str:
    if cot:
        return ("First please perform reasoning, and think step by step to provide best answer to the following "
                f"question with the option's letter ({letters_for(n_options)}) from the given choices.")
    return f"\nAnswer with the option's letter ({letters_for(n_options)}) from the given choices directly."


def build_prompt(question: str, options: list[str], cot: bool, subtitles: str | None = None) -> str:
    """The task's doc_to_text (or doc_to_text_subtitle when `subtitles` is given: "" means none available)."""
    basis = "the video and the subtitles" if subtitles is not None else "the video"
    instruction = (f"Select the best answer to the following multiple-choice question based on {basis}. "
                   f"Respond with the letter ({letters_for(len(options))}) of the correct option.")
    body = instruction + "\n" + question + "\n" + "\n".join(options) + "\n" + post_prompt(len(options), cot)
    if subtitles is None:
        return body
    return SUBTITLE_HEADER + (subtitles or NO_SUBTITLES) + "\n" + body


def extract_characters_regex(text: str) -> str:
    text = text.strip()
    for prefix in ANSWER_PREFIXES:
        text = text.replace(prefix, "")
    if len(text.split()) > 10 and not re.search("[ABCDE]", text):
        return ""
    match = re.search(r"[ABCDE]", text)
    return match[0] if match else ""


# ---- CoT post-processing (LLM maps free text to a letter) ----

MCQ_EXTRACT_PROMPT = ("Given the original multiple-choice options and a model-generated answer containing reasoning "
                      "and a final answer, identify the option that best matches the final answer and return only "
                      "the corresponding letter (A, B, C, D, or E).")
MBIN_EXTRACT_PROMPT = ("Given the original binary options and a model-generated answer containing reasoning and a "
                       "final answer, identify the option that best matches the final answer and return only the "
                       "corresponding letter (A or B).")


def extraction_prompt(options: list[str], response: str) -> str:
    instruction = MBIN_EXTRACT_PROMPT if len(options) == 2 else MCQ_EXTRACT_PROMPT
    text = f"The options are: {options}\n\n The model response is: {response}"
    return (f"{instruction}:\n\nText:\n{text}\n\nOnly return the letter A, B, C, D, or E. "
            "If none is found, return \"None\".")


def parse_extracted_letter(reply: str, n_options: int) -> str | None:
    """The extractor's reply must be exactly one allowed letter (case-insensitive), else None."""
    reply = reply.strip().upper()
    allowed = "[A-B]" if n_options == 2 else "[A-E]"
    return reply if re.fullmatch(allowed, reply) else None


def random_wrong_letter(answer: str, n_options: int, rng: np.random.Generator) -> str:
    """Upstream's conservative fallback when the extractor fails: a letter that is certainly wrong."""
    wrong = [letter for letter in LETTERS[:n_options] if letter != answer]
    return wrong[int(rng.integers(len(wrong)))]


def cot_letter(response: str, options: list[str], answer: str, extract: Callable[[str], str],
               rng: np.random.Generator) -> tuple[str, str]:
    """(letter, the extractor's reply); the letter then goes through extract_characters_regex as upstream."""
    reply = extract(extraction_prompt(options, response))
    return letter_of_reply(reply, options, answer, rng), reply


def letter_of_reply(reply: str, options: list[str], answer: str, rng: np.random.Generator) -> str:
    """The extractor's letter, or (it failed) a random wrong one drawn from `rng`."""
    choice = parse_extracted_letter(reply, len(options))
    return choice if choice is not None else random_wrong_letter(answer, len(options), rng)


# ---- step-wise CoT judge ----

STEP_RUBRIC = """
You are a intelligent assistant for grading math question solutions. You will be given:
- A mathematical question (question) with multiple-choice options (options).
- A list of numbered ground truth steps (gt_steps) showing the correct reasoning to solve a math problem.
- A answer (answer) that is the correct final solution to the question.
- A model prediction (prediction) that includes the steps the model followed and possibly the final answer.

TASK: Compare the prediction to gt_steps and assign a score out of 10 using the rubric below. You must reward both matching logic and valid alternative reasoning. Avoid overly strict step-by-step comparison, instead focus if the model follows a coherent and plausible mathematical approach.

---

### Scoring Rubric:

#### 1. Relative Step Matching (Main Criterion)
- Count the total number of ground truth steps: N
- Evaluate how many predicted steps correctly align with gt_steps in terms of mathematical logic, reasoning, or computations. 
- Score = (matching steps / N) × 10, rounded to nearest whole number. 
- Remember: A step MATCHES if it serves the same mathematical purpose, even if phrased or ordered differently.

#### 2. Correct Final Answer via Different Reasoning
- If the model's final answer is correct, and the steps are logically valid (even if they differ from gt_steps), assign a full score of 10.
- Ignore number of matching steps in this case unless the reasoning is clearly flawed or incoherent.
- Carefully analyze if predicted alternative reasoning includes incorrect observations that contradict parts of the ground truth. Reduce the score proportionally even if the final answer is correct.
- Remember: Reward even PARTIALLY correct reasoning if the steps are accurate, meaningful and follow a valid alternative path to the correct answer.

#### 3. **Implicit or Inferred Steps**
- Do NOT penalize if early steps are skipped, but later logic clearly depends on them.
- E.g., if a model does not mention "identify the chart," but proceeds to use values from that chart correctly, assume the step was completed implicitly.
- Remember: ALWAYS check for implied steps before reducing the score. Credit should be given when logic shows the step was likely understood.

#### 4. **Ignore Superficial Differences**  
- Do NOT deduct score for formatting, using a different notation or variable names, or additional clarifications.
- Remember: FOCUS on the underlying mathematical meaning rather than literal step-by-step matching.

---

**Output Format: Score Dict (strict):**  
SCORE_CARD: {"matched_steps": "X/N", "final_answer_correct": <0 or 1>, "critique": "<2–3 sentence summary>", "score": <0–10>}

Be strict when awarding credit. Do NOT be lenient. Carefully evaluate how far the model's reasoning aligns with the ground truth steps before assigning a score.
"""
SCORE_CARD_FORMAT = ('SCORE_CARD: {"matched_steps": "X/N", "final_answer_correct": <0 or 1>, '
                     '"critique": "<2–3 sentence summary>", "score": <0–10>}')
FAILED_SCORE_CARD = {"matched_steps": "0/0", "final_answer_correct": 0, "critique": "Error", "score": 0}


def step_judge_prompt(question: str, options: Any, steps: Any, answer: str, prediction: str) -> str:
    return (f"\nINSTRUCTIONS: {STEP_RUBRIC}\n\nQUESTION: {question}\n\nOPTIONS: {options}\n\n"
            f"GROUND TRUTH STEPS:\n{json.dumps(steps, indent=2)}\n\nCORRECT FINAL ANSWER:\n{answer}\n\n"
            f"PREDICTION:\n{prediction}\n\nNow evaluate this prediction and return the response in the specified "
            f"format: {SCORE_CARD_FORMAT}\n\n")


def _parse_literal(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return json.loads(json.dumps(ast.literal_eval(text)))
        except Exception:  # noqa: BLE001 - any unparsable reply is a failed score card
            return None


def parse_score_card(reply: str) -> dict:
    """The text after the last "SCORE_CARD: " as JSON (then a Python literal); anything else -> score 0, "Error"."""
    parsed = _parse_literal(reply.strip().split("SCORE_CARD: ")[-1])
    if not isinstance(parsed, dict):
        return dict(FAILED_SCORE_CARD)
    try:
        return {"matched_steps": parsed.get("matched_steps", ""),
                "final_answer_correct": parsed.get("final_answer_correct", 0),
                "critique": str(parsed.get("critique", "")).strip(), "score": int(parsed.get("score", 0))}
    except (TypeError, ValueError):
        return dict(FAILED_SCORE_CARD)


# ---- multi-binary and aggregation ----

def strip_letter(option: str) -> str:
    return re.sub(r"^\s*[A-E][.)]\s*", "", option)


def binary_pairs(row: dict) -> list[dict]:
    """Derive multi-binary rows from a 5-way row (the official `multi_binary` config ships them ready-made):
    the correct option against each distractor, the correct one at A for even-numbered pairs, at B otherwise."""
    correct = LETTERS.index(row["answer"])
    texts = [strip_letter(option) for option in row["options"]]
    pairs = []
    for k, wrong in enumerate(i for i in range(len(texts)) if i != correct):
        first, second = (correct, wrong) if k % 2 == 0 else (wrong, correct)
        pairs.append({**row, "options": [f"A. {texts[first]}", f"B. {texts[second]}"],
                      "answer": "A" if k % 2 == 0 else "B", "pair": k})
    return pairs


def percent(correct: int, total: int) -> float:
    return 100.0 * correct / total if total else 0.0


def grouped_accuracy(outcomes: Iterable[tuple[dict, bool]], keys: Iterable[str]) -> dict:
    """{key: {value: {"accuracy": %, "n": count}}} for each metadata key present in the records."""
    outcomes = list(outcomes)
    tables = {}
    for key in keys:
        tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for meta, correct in outcomes:
            if meta.get(key) is not None:
                tally[str(meta[key])][0] += int(correct)
                tally[str(meta[key])][1] += 1
        if tally:
            tables[key] = {value: {"accuracy": percent(c, n), "n": n} for value, (c, n) in sorted(tally.items())}
    return tables


def question_outcomes(records: list[dict], multi_binary: bool) -> list[tuple[dict, bool]]:
    """One (metadata, correct) per question: MCQ per row; multi-binary only if every pair of the question is
    right (rows grouped by question_id)."""
    if not multi_binary:
        return [(record, record["pred_answer"] == record["answer"]) for record in records]
    groups: dict[Any, list[dict]] = defaultdict(list)
    for record in records:
        groups[record["question_id"]].append(record)
    return [(group[0], all(r["pred_answer"] == r["answer"] for r in group)) for group in groups.values()]


def score_table(records: list[dict], multi_binary: bool) -> dict:
    outcomes = [({**meta, "length_category": f"{meta.get('length')}_{meta.get('category')}"}, correct)
                for meta, correct in question_outcomes(records, multi_binary)]
    return {"accuracy": percent(sum(c for _, c in outcomes), len(outcomes)), "questions": len(outcomes),
            **grouped_accuracy(outcomes, ("length", "category", "reasoning_type", "length_category"))}
