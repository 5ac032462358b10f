"""run() for `iclrkit uq tokur`."""

from __future__ import annotations

import json

import numpy as np
import torch

from toolkit.core.errors import BadInputError, require
from toolkit.uq import tokur
from toolkit.uq.config import TokURConfig

QUESTION_FIELDS = ("question", "problem", "query")
SOLUTION_FIELDS = ("answer", "solution", "response")


def load_problems(path: str, limit: int | None = None) -> list[dict]:
    """Math problems as {question, answer (the worked solution when there is one), final (reference answer)}.

    GSM8K's answer ends in "#### N"; MATH has a solution with \\boxed{…} and, in MATH-500, a bare one-line answer
    (preferred when present); MetaMath's response ends in "The answer is: …" (toolkit.uq.math_answer)."""
    from toolkit.data.text import read_jsonl
    from toolkit.uq.math_answer import reference_final

    rows = read_jsonl(path)[:limit]
    require(rows, f"{path} has no records")
    items = []
    for number, row in enumerate(rows, 1):
        question = next((row[k] for k in QUESTION_FIELDS if k in row), None)
        texts = [str(row[k]) for k in SOLUTION_FIELDS if k in row]
        if question is None or not texts:
            raise BadInputError(f"{path}: record {number} needs a question ({' | '.join(QUESTION_FIELDS)}) and an "
                                f"answer ({' | '.join(SOLUTION_FIELDS)})")
        finals = [reference_final(text) for text in texts]
        final = next((f for f in finals if f), None)
        if final is None:
            raise BadInputError(f"{path}: record {number} has no final answer (\\boxed{{…}}, 'The answer is: …', "
                                "'#### N' or a one-line answer)")
        solution = max(texts, key=len)  # the worked solution, for the σ anchors
        items.append({"question": str(question), "answer": solution, "final": final})
    return items


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[torch.Tensor], n: int, max_new_tokens: int,
                     temperature: float, seeds: list[int]) -> list[list[torch.Tensor]]:
    """n sampled responses per prompt (token ids, cut at the first EOS, EOS kept so its uncertainty counts), the
    prompts in one generate call (left-padded, n rows each). Each prompt samples from its own generator seeded with
    seeds[i], with the draws of transformers' own temperature sampling of that prompt alone (`do_sample`,
    `num_return_sequences=n` after `torch.manual_seed(seeds[i])`): it draws while any of its rows is unfinished, and
    no row depends on the other rows. With several prompts the left padding can change logits in their last bits
    (attention sums in another order), so a sampled token may, rarely, differ. Decoding n·len(prompts) rows at once
    costs little more than n rows on a CPU: each step reads the weights once."""
    from transformers import LogitsProcessor, LogitsProcessorList

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id or tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts) * n, width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i * n:(i + 1) * n, width - len(prompt):] = prompt
        mask[i * n:(i + 1) * n, width - len(prompt):] = 1
    stop = model.generation_config.eos_token_id  # what generate stops a row on (None: it never stops early)
    stop = torch.tensor([] if stop is None else [stop] if isinstance(stop, int) else list(stop), dtype=torch.long,
                        device=device)

    class PerPromptSampler(LogitsProcessor):
        """Temperature sampling as generate does it (softmax(scores / T), one multinomial on a prompt's n rows),
        from the prompt's own generator; returned as a one-hot choice that greedy decoding takes."""

        def __init__(self):
            self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

        def __call__(self, input_ids, scores):
            choice = torch.full_like(scores, float("-inf"))
            finished = torch.isin(input_ids[:, width:], stop).any(-1)
            for i, generator in enumerate(self.generators):
                rows = torch.arange(i * n, (i + 1) * n, device=scores.device)
                if finished[rows].all():  # sampled alone, its generate call would have stopped here
                    choice[rows, pad] = 0.0
                    continue
                probs = torch.softmax(scores[rows] / temperature, dim=-1)
                choice[rows, torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)] = 0.0
            return choice

    output = model.generate(ids.to(device), attention_mask=mask.to(device), do_sample=False,
                            max_new_tokens=max_new_tokens, pad_token_id=pad,
                            logits_processor=LogitsProcessorList([PerPromptSampler()]))
    responses = []
    for row in output[:, width:].cpu():
        ends = (row == tokenizer.eos_token_id).nonzero()
        responses.append(row[:int(ends[0]) + 1] if len(ends) else row)
    return [responses[i * n:(i + 1) * n] for i in range(len(prompts))]


def best_of_n_accuracy(correct: np.ndarray, scores: np.ndarray) -> float:
    """Accuracy when each question keeps its lowest-uncertainty candidate."""
    return float(np.mean([row_correct[tokur.best_of_n(list(row))] for row_correct, row in zip(correct, scores)]))


def majority_vote_accuracy(correct: np.ndarray, finals: list[list[str | None]], stats=None) -> float:
    """Accuracy of self-consistency: each question keeps the answer most of its candidates agree on (answers
    grouped by math equivalence, judgements counted in `stats` (a math_answer.JudgeStats) when given; no answer
    never wins; ties go to the group seen first)."""
    from toolkit.uq.math_answer import equivalent

    picks = []
    for row_correct, row_finals in zip(correct, finals):
        groups: list[list[int]] = []
        for i, final in enumerate(row_finals):
            if final is None:
                continue
            group = next((g for g in groups if equivalent(final, row_finals[g[0]], stats)), None)
            if group is None:
                groups.append([i])
            else:
                group.append(i)
        picks.append(bool(row_correct[max(groups, key=len)[0]]) if groups else False)
    return float(np.mean(picks))


def selection_rows(correct: np.ndarray, scores: np.ndarray) -> list[dict]:
    """Best-of-N accuracies: lowest uncertainty, the expected accuracy of a uniformly random pick, the first."""
    return [{"selection": "tokur", "accuracy": best_of_n_accuracy(correct, scores)},
            {"selection": "random", "accuracy": float(correct.mean())},
            {"selection": "first", "accuracy": float(correct[:, 0].mean())},
            {"selection": "oracle", "accuracy": float(correct.max(axis=1).mean())}]


def run_tokur(config: TokURConfig, ctx) -> dict:
    from toolkit.models.source import load_model
    from toolkit.uq.math_answer import JudgeStats

    judge = JudgeStats()
    items = load_problems(config.data, config.limit)
    require("{question}" in config.prompt_template, "prompt_template must contain {question}")
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    model.eval()
    projections = tokur.attention_projections(model, config.rank)

    def encode(text: str) -> torch.Tensor:
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def prompt_ids(item: dict) -> torch.Tensor:
        return encode(config.prompt_template.format(question=item["question"]))

    items, sigma, trace = _sigma(config, ctx, model, projections, items, prompt_ids, encode)
    records, correct, scores, finals = _score_questions(config, ctx, model, tokenizer, projections, items,
                                                        [prompt_ids(item) for item in items], sigma, judge)
    aurocs, rows = _summarise(config, records, correct, scores, finals, judge)
    if judge.timeouts:
        ctx.warn(f"{judge.timeouts} of {judge.judged} answer judgements passed the judge's time limit and were judged "
                 "not equal (metrics.judge)")
    ctx.inputs["model"] = config.model
    ctx.metrics.update(sigma=sigma, sigma_search=trace, auroc=aurocs.get(config.score), auroc_by_score=aurocs,
                       judge=judge.as_dict(), n_questions=len(items), n_responses=len(records), rows=rows)
    return {"sigma": sigma, "auroc": aurocs.get(config.score), "rows": rows}


def _sigma(config, ctx, model, projections, items, prompt_ids, encode):
    """(the items left to evaluate, σ, the search trace): σ searched on anchor records (anchor_data, or the first
    anchor_size records, which are then not evaluated), or the configured value."""
    if config.sigma != "auto":
        return items, float(config.sigma), []
    if config.anchor_data:
        anchor_items = load_problems(config.anchor_data, config.anchor_size)
    else:
        require(len(items) > config.anchor_size, f"σ search takes the first {config.anchor_size} records as "
                "anchors and none would be left to evaluate: pass anchor_data or lower anchor_size")
        anchor_items, items = items[:config.anchor_size], items[config.anchor_size:]
    anchors = [(prompt_ids(item), encode(" " + item["answer"] if config.anchor_answer == "solution"
                                         else item["final"])) for item in anchor_items]
    sigma, trace = tokur.calibrate_sigma(model, projections, anchors, config.nll_threshold,
                                         config.search_iterations, config.sigma_max, ctx.seed)
    return items, sigma, trace


def _score_questions(config, ctx, model, tokenizer, projections, items, prompts, sigma, judge):
    """Candidates sampled per question (generate_batch questions at a time), each scored token by token and judged;
    every record also goes to responses.jsonl as it is made. Returns (records, correct, scores, finals)."""
    from toolkit.uq.math_answer import equivalent, predicted_final

    records, correct, scores, finals = [], [], [], []
    sampled: dict[int, list[torch.Tensor]] = {}
    with open(ctx.path("responses.jsonl"), "w") as log:
        for qi, (item, prompt_ids) in enumerate(ctx.progress(list(zip(items, prompts)), total=len(items),
                                                             description="questions")):
            if qi not in sampled:
                block = range(qi, min(qi + config.generate_batch, len(items)))
                sampled.update(zip(block, sample_responses(
                    model, tokenizer, [prompts[j] for j in block], config.candidates, config.max_new_tokens,
                    config.temperature, [ctx.seed + j for j in block])))
            row_correct, row_finals, row_scores = [], [], {name: [] for name in ("total", "aleatoric", "epistemic")}
            for ci, response in enumerate(sampled.pop(qi)):
                parts = tokur.token_uncertainty(model, projections, prompt_ids, response, sigma, config.samples,
                                                seed=ctx.seed * 7919 + qi * 97 + ci)
                summary = {name: tokur.aggregate(values, config.aggregate) for name, values in parts.items()}
                text = tokenizer.decode(response, skip_special_tokens=True)
                final = predicted_final(text)
                ok = equivalent(final, item["final"], judge)
                row_correct.append(ok)
                row_finals.append(final)
                for name, value in summary.items():
                    row_scores[name].append(value)
                record = {"question": qi, "candidate": ci, "response": text, "final": final, "reference": item["final"],
                          "correct": ok, **summary}
                records.append(record)
                log.write(json.dumps(record) + "\n")
            log.flush()  # a run stopped from outside keeps every question it finished
            correct.append(row_correct)
            finals.append(row_finals)
            scores.append(row_scores)
    return records, correct, scores, finals


def _summarise(config, records, correct, scores, finals, judge) -> tuple[dict, list]:
    """(AUROC of each score for detecting a wrong answer, the best-of-n selection rows)."""
    from toolkit.eval.metrics import auroc

    correct_arr = np.array(correct)
    errors = ~correct_arr.ravel()
    aurocs = {}
    if errors.any() and (~errors).any():
        aurocs = {name: auroc([r[name] for r in records], errors) for name in ("total", "aleatoric", "epistemic")}
    by_score = {name: np.array([row[name] for row in scores]) for name in ("total", "aleatoric", "epistemic")}
    rows = selection_rows(correct_arr, by_score[config.score])
    rows.append({"selection": "majority", "accuracy": majority_vote_accuracy(correct_arr, finals, judge)})
    rows += [{"selection": f"tokur-{name}", "accuracy": best_of_n_accuracy(correct_arr, values)}
             for name, values in by_score.items() if name != config.score]
    return aurocs, rows
