"""Scripted models for the synthetic fixtures (toolkit/bench/fixtures.py): replies fixed in advance, so the scores
the harnesses must produce can be worked out by hand. Served behind `toolkit.llm.server.LoopbackServer` by the
tests (tests/cli/test_bench_*.py, tests/unit/test_bench_mmsearch.py) and by examples/bench/repro.py.

- `scripted_vlm(prompt)`: answers the six VideoMathQA fixture questions. Direct MCQ: right on q0-q3, wrong on q4
  and q5. Multi-binary: right on every pair except q2's pair that shows "11". CoT: the same letters after
  "FINAL=", q3's is "?" (the letter extractor then answers "None"). Step judge: score 10 for q0, 4 for q1, an
  unparsable reply otherwise.
- `scripted_agent(prompt, images)`: the MMSearch-Plus policy — crop the asked quarter's mark, search the crop, open
  the first result, read the city; without marks it searches the whole image and reads a wrong page.
- `scripted_agent_reply(prompt)`: the agent plus an answer judge (NOT_ATTEMPTED for "unknown", else CORRECT)."""

from __future__ import annotations

import json
import re

from toolkit.bench import fixtures

ITEMS = fixtures.VIDEOMATHQA_ITEMS
WRONG_DIRECT = {4, 5}  # questions the scripted model gets wrong when answering directly
CORRECT_TEXT = {q: opts["ABCDE".index(a)] for q, opts, a, *_ in ITEMS}


def item_of(prompt: str) -> int:
    return next(i for i, item in enumerate(ITEMS) if item[0] in prompt)


def scripted_vlm(prompt: str) -> str:
    if "SCORE_CARD" in prompt:  # step judge: 10 for q0, 4 for q1, unparsable otherwise
        score = {0: 10, 1: 4}.get(item_of(prompt))
        return f'SCORE_CARD: {{"matched_steps": "1/2", "final_answer_correct": 1, "critique": "ok", "score": {score}}}' \
            if score is not None else "I refuse to grade."
    if "The model response is:" in prompt:  # CoT letter extractor
        final = re.search(r"FINAL=(\S)", prompt)[1]
        return final if final != "?" else "None"
    number = item_of(prompt)
    question, options, answer = ITEMS[number][:3]
    options_shown = re.findall(r"^([A-E])\. (.*)$", prompt, re.M)
    if len(options_shown) == 2:  # multi-binary: right on every pair except q2's first pair
        right = next(letter for letter, text in options_shown if text == CORRECT_TEXT[question])
        wrong = next(letter for letter, text in options_shown if text != CORRECT_TEXT[question])
        return f"The best answer is {wrong if number == 2 and '. 11' in prompt else right}"
    guess = answer if number not in WRONG_DIRECT else ("A" if answer != "A" else "B")
    if "think step by step" in prompt:
        return f"Let me think. The total follows. FINAL={'?' if number == 3 else guess}"
    return f"The best answer is {guess}."


def scripted_agent(prompt: str, images) -> str:
    """Policy: crop the asked quarter's mark, search the crop, open the first result, read the city."""
    if "Tools" not in prompt:
        return "<answer>unknown</answer>"
    last = prompt.rsplit("<observation>", 1)[1] if "<observation>" in prompt else None
    if last is None:
        if "Numbered marks" in prompt:
            quarter = next(q for q in fixtures.QUARTERS if f"the {q} quarter" in prompt)
            return f'<tool>{{"name": "crop", "args": {{"image": "img_1", "mark": {fixtures.QUARTERS.index(quarter) + 1}}}}}</tool>'
        return '<tool>{"name": "image_search", "args": {"image": "img_1"}}</tool>'
    if "created crop_" in last:
        return '<tool>{"name": "image_search", "args": {"image": "crop_1"}}</tool>'
    if "[1] " in last:
        url = last.split("(", 1)[1].split(")", 1)[0]
        return json.dumps({"note": "open"}) + f'<tool>{{"name": "fetch", "args": {{"url": "{url}"}}}}</tool>'
    found = [w.split()[0].rstrip(".") for w in last.split("stands in ")[1:]]
    return f"<answer>{found[0] if found else 'unknown'}</answer>"


def scripted_agent_reply(prompt: str) -> str:
    if prompt.startswith("You grade answers"):
        return "NOT_ATTEMPTED" if "Predicted answer: unknown" in prompt else "CORRECT"
    return scripted_agent(prompt, [])
