"""run() for `iclrkit prompt mhlp`."""

from __future__ import annotations

import json
import re

import numpy as np

from toolkit.core.errors import BadInputError, ResourceError, require
from toolkit.prompt import mhlp
from toolkit.prompt.config import MHLPConfig


def load_examples(path: str) -> list[dict]:
    from toolkit.data.text import read_jsonl

    rows = read_jsonl(path, required=("question", "answer"))
    require(len(rows) >= 2, f"{path}: MHLP needs at least 2 examples (chain + evaluation), got {len(rows)}")
    return [{"question": str(r["question"]), "answer": str(r["answer"]).strip().lower()} for r in rows]


def split_examples(rows: list[dict], train_size: int, eval_size: int, seed: int) -> tuple[list, list]:
    order = np.random.default_rng(seed).permutation(len(rows))
    n_train = min(train_size, len(rows) - 1)
    train = [rows[i] for i in order[:n_train]]
    test = [rows[i] for i in order[n_train:n_train + eval_size]]
    return train, test


def check_can_score(llm, role: str, chat: bool = False) -> None:
    """Probe once so a server without echo log-probs fails before any sampling, naming the capability."""
    llm.require("chat_score" if chat else "score", f"MHLP ({role}: proposal, prior and likelihood log-probs)")
    try:
        llm.score(["Question:"], [" yes"], chat=chat)
    except ResourceError as exc:
        raise ResourceError(f"{role} backend '{llm.name}' cannot score supplied text (capability 'score': "
                            f"log-probs of given text), which MHLP needs", exc.hint) from None


def uncertainty_row(method: str, probs: np.ndarray, labels: list[int]) -> dict:
    from toolkit.eval.metrics import brier_score, expected_calibration_error

    predictions = probs.argmax(axis=1)
    return {"method": method, "accuracy": float(np.mean(predictions == np.asarray(labels))),
            "ece": expected_calibration_error(probs, labels), "brier": brier_score(probs, labels),
            "confidence": float(np.mean(probs.max(axis=1)))}


def run_mhlp(config: MHLPConfig, ctx) -> dict:
    from toolkit.llm import load_llm

    rows = load_examples(config.data)
    try:
        re_pattern = re.compile(config.answer_pattern)
    except re.error as exc:
        raise BadInputError(f"answer_pattern is not a valid regex: {exc}") from None
    require(re_pattern.groups >= 1, "answer_pattern needs one capture group for VALUE")
    classes = config.classes or sorted({r["answer"] for r in rows})
    require(len(classes) >= 2, "MHLP's calibration metrics need at least 2 answer classes")
    train, test = split_examples(rows, config.train_size, config.eval_size, ctx.seed)
    labels_of(test + train if config.predictive == "score" else test, classes)  # fail before the chain runs
    require(config.predictive == "sample" or "{}" in config.answer_template,
            "answer_template needs {} where the class goes")
    task = load_llm(config.task_model, device=ctx.device, dtype=ctx.torch_dtype, concurrency=config.concurrency)
    proposer = (task if config.proposer_model == config.task_model
                else load_llm(config.proposer_model, device=ctx.device, dtype=ctx.torch_dtype,
                              concurrency=config.concurrency))
    check_can_score(proposer, "proposer", config.chat)
    check_can_score(task, "task", config.chat)

    samples, log_path, accepted, priors = [], ctx.path("chain.jsonl"), [], {}
    with open(log_path, "w", buffering=1) as log:  # line-buffered: a long chain can be followed live
        for chain in range(config.chains):
            rng = np.random.default_rng(ctx.seed + chain)
            agent = mhlp.LLMProposer(task, proposer, config.temperature, config.max_response_tokens,
                                     config.max_prompt_tokens, seed=ctx.seed * 1000 + chain * 100_000,
                                     chat=config.chat)
            theta, states = config.initial_prompt, [config.initial_prompt]
            for step in ctx.progress(range(config.steps), total=config.steps, description=f"chain {chain}"):
                theta, record = mhlp.mh_step(agent, task, theta, train[step % len(train)], config.beta,
                                             config.meta_prompt, rng, config.answer_pattern, priors)
                states.append(theta)
                accepted.append(record["accepted"])
                log.write(json.dumps({"chain": chain, "step": step, **record}) + "\n")
            samples += mhlp.thin(states, config.burn_in, config.thinning)
    require(samples, "burn_in leaves no samples: lower burn_in or raise steps")
    with open(ctx.path("samples.json"), "w") as f:
        json.dump(samples, f, indent=1)

    candidates = list(dict.fromkeys([config.initial_prompt, *samples]))
    evaluate = score_rows if config.predictive == "score" else sample_rows
    rows_out, selection = evaluate(config, ctx, task, candidates, samples, train, test, classes)
    with open(ctx.path("prompt_accuracy.json"), "w") as f:
        json.dump(selection, f, indent=1)
    ctx.inputs.update(task_model=config.task_model, proposer_model=config.proposer_model)
    ctx.metrics.update(n_samples=len(samples), acceptance_rate=float(np.mean(accepted)), n_train=len(train),
                       n_eval=len(test), rows=rows_out)
    return {"rows": rows_out, "acceptance_rate": float(np.mean(accepted)), "n_samples": len(samples)}


def labels_of(examples: list[dict], classes: list[str]) -> list[int]:
    labels = [classes.index(r["answer"]) if r["answer"] in classes else -1 for r in examples]
    require(all(label >= 0 for label in labels), "an answer is not among `classes`")
    return labels


def sample_rows(config: MHLPConfig, ctx, task, candidates, samples, train, test, classes):
    """The official posterior predictive: answer frequencies, every prompt sampling as many answers as there are
    posterior samples; the single best prompt by greedy accuracy on the chain examples."""
    questions, labels = [r["question"] for r in test], labels_of(test, classes)
    train_accuracy = mhlp.prompt_accuracies(task, candidates, train, config.max_response_tokens,
                                            config.answer_pattern, config.chat)
    best = candidates[int(np.argmax(train_accuracy))]

    def row(method: str, prompts: list[str]) -> dict:
        probs, format_rate = mhlp.predictive(task, prompts, questions, classes, config.temperature,
                                             config.max_response_tokens, ctx.seed, config.answer_pattern,
                                             config.chat)
        return {**uncertainty_row(method, probs, labels), "format_rate": format_rate}

    rows_out = [row("mhlp", samples), row("single", [best] * len(samples))]
    # the initial prompt's row is the single row again when it is the best prompt (same prompts, same seeds)
    rows_out.append({**rows_out[1], "method": "initial"} if best == config.initial_prompt
                    else row("initial", [config.initial_prompt] * len(samples)))
    return rows_out, [{"prompt": p, "train_accuracy": float(a)} for p, a in zip(candidates, train_accuracy)]


def score_rows(config: MHLPConfig, ctx, task, candidates, samples, train, test, classes):
    """Class-word scoring: each distinct prompt is scored once on the chain and evaluation examples."""
    from toolkit.prompt.scoring import class_probabilities, model_average

    train_labels, labels = labels_of(train, classes), labels_of(test, classes)
    selection, eval_probs = [], {}
    for prompt in ctx.progress(candidates, total=len(candidates), description="scoring prompts"):
        probs = class_probabilities(task, prompt, [r["question"] for r in train + test], classes,
                                    config.answer_template, config.chat)
        train_probs, eval_probs[prompt] = probs[:len(train)], probs[len(train):]
        gold = train_probs[np.arange(len(train)), train_labels]
        selection.append({"prompt": prompt, "train_accuracy": float(np.mean(train_probs.argmax(1) == train_labels)),
                          "train_gold_logprob": float(np.mean(np.log(np.maximum(gold, 1e-300)))),
                          # diagnostic only (not used to pick `single`): this prompt alone on the evaluation set
                          "eval": uncertainty_row("alone", eval_probs[prompt], labels)})
    best = max(selection, key=lambda s: (s["train_accuracy"], s["train_gold_logprob"]))["prompt"]
    ensemble = model_average([eval_probs[p] for p in samples])
    rows_out = [uncertainty_row("mhlp", ensemble, labels), uncertainty_row("single", eval_probs[best], labels),
                uncertainty_row("initial", eval_probs[config.initial_prompt], labels)]
    return rows_out, selection
