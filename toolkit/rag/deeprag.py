"""DeepRAG: step-wise retrieve-or-answer decisions (Guan et al., ICLR 2026, https://arxiv.org/abs/2502.01142;
official code https://github.com/gxy-gxy/DeepRAG). `index` builds the retriever, `synth` runs the binary-tree
search for minimum-retrieval trajectories and calibration pairs, `train` runs imitation learning + chain of
calibration, `run` evaluates DeepRAG and the baselines (no retrieval, always retrieve, single-shot RAG).
"""

from __future__ import annotations

import copy
from pathlib import Path

from toolkit.core.errors import BadInputError, require
from toolkit.core.records import JsonlWriter, write_json, write_jsonl
from toolkit.models import tokens
from toolkit.rag import infer
from toolkit.rag.config import IndexConfig, RunConfig, SynthConfig, TrainConfig
from toolkit.rag.qa import QAItem, load_qa
from toolkit.rag.search import calibration_pairs, tree_search
from toolkit.rag.trace import (
    FINAL,
    FOLLOW,
    INTERMEDIATE,
    Step,
    Trace,
    extract_final,
    question_prompt,
    render_context,
    render_step,
    render_trace,
)

PAPER = "https://arxiv.org/abs/2502.01142"


# ---------------------------------------------------------------- retrieval


def make_retrieve(index: str, items: list[QAItem], top_k: int, passage_words: int | None = None):
    """A per-item function subquery -> rendered passages (cut to `passage_words` words when given)."""
    def render(passage) -> str:
        text = passage.render()
        return " ".join(text.split()[:passage_words]) if passage_words else text


    from toolkit.rag.retrieval import build_index, load_index

    if index == "contexts":
        require(all(item.contexts for item in items), "index=contexts needs every question to carry its own "
                                                       "paragraphs (HotpotQA `contexts`)")
        cache: dict[str, object] = {}

        def for_item(item: QAItem):
            if item.id not in cache:
                cache[item.id] = build_index(item.contexts, "bm25")
            retriever = cache[item.id]
            return lambda q: [render(p) for p, _ in retriever.search([q], top_k)[0]]

        return for_item
    require(Path(index).is_dir(), f"index directory not found: {index}")
    retriever = load_index(index)
    shared = lambda q: [render(p) for p, _ in retriever.search([q], top_k)[0]]  # noqa: E731
    return lambda item: shared


def load_llm_for(spec: str, ctx, batch_size: int, concurrency: int = 1):
    from toolkit.llm import load_llm

    llm = load_llm(spec, device=ctx.device, dtype=ctx.torch_dtype, cache_dir=str(ctx.path("llm-cache", record=False)),
                   concurrency=concurrency)
    if hasattr(llm, "batch_size"):
        llm.batch_size = batch_size
    return llm


def run_index(config: IndexConfig, ctx) -> dict:
    from toolkit.rag.qa import load_corpus
    from toolkit.rag.retrieval import build_index, save_index

    passages = load_corpus(config.corpus)
    retriever = build_index(passages, config.retriever)
    save_index(retriever, ctx.path("index", record=True))
    ctx.metrics.update({"passages": len(passages), "retriever": config.retriever})
    return ctx.metrics


# ---------------------------------------------------------------- synthesis


def answer_matches(prediction: str, answers: list[str]) -> bool:
    """The search's correctness check: exact match, or token F1 above 0.7 (the official check is a normalized
    containment score above 0.7)."""
    from toolkit.eval.metrics import exact_match, token_f1

    return bool(exact_match(prediction, answers)) or token_f1(prediction, answers) > 0.7


class ModelOracle:
    """Asks the model at a tree node. Paper mode: the next line (a sub-question or the final answer) is generated
    under the decomposition prompt after the chain so far; the parametric answer is generated in-chain (the same
    prompt, history, "Follow up: q", "Intermediate answer:"); the retrieval answer comes from the reader prompt over
    the passages. Every generation is cached by its full prompt (the tree shares prefixes)."""

    def __init__(self, llm, config: SynthConfig, item: QAItem, shared_cache: dict):
        self.llm, self.config, self.item, self.cache = llm, config, item, shared_cache
        self.gold = item.decomposition if config.decompose != "model" else None
        self.prompt = question_prompt(item.question, config.decompose_instruction, config.decompose_few_shot)

    def _line(self, prompt: str) -> str:
        if prompt not in self.cache:
            text = self.llm.generate([prompt], max_new_tokens=self.config.max_new_tokens, stop=["\n"])[0].text
            self.cache[prompt] = text.split("\n", 1)[0].strip()
        return self.cache[prompt]

    def _chain(self, steps) -> str:
        return self.prompt + "".join(render_step(step) for step in steps)

    def propose(self, question: str, steps) -> tuple[str, str]:
        answers = [step.answer for step in steps]
        if self.gold is not None:
            if len(steps) >= len(self.gold):  # the final answer is still the model's
                return "final", extract_final(self._line(self._chain(steps) + f"{FINAL} <answer short>"))
            try:
                return "follow", self.gold[len(steps)].format(None, *answers)
            except (IndexError, KeyError, ValueError):
                raise BadInputError(f"question {self.item.id}: decomposition {self.gold!r} refers to an answer "
                                    "that does not exist yet (use {1} for the first answer, {2} the second, ...)")
        line = self._line(self._chain(steps))
        if line.startswith(FOLLOW) and line[len(FOLLOW):].strip():
            return "follow", line[len(FOLLOW):].strip()
        return "final", extract_final(line)

    def parametric(self, question: str, steps, subquery: str) -> str:
        if self.config.parametric == "standalone":
            return self._line(self.config.parametric_prompt.format(subquery=subquery))
        return self._line(self._chain(steps) + f"{FOLLOW} {subquery}\n{INTERMEDIATE}")

    def from_context(self, question: str, steps, subquery: str, passages: list[str]) -> str:
        return self._line(self.config.reader_prompt.format(context=render_context(passages), subquery=subquery))


def run_synth(config: SynthConfig, ctx) -> dict:
    items = load_qa(config.data, config.limit)
    if config.decompose == "gold":
        require(all(item.decomposition for item in items), "decompose=gold needs a `decomposition` on every question")
    retrieve_for = make_retrieve(config.index, items, config.top_k)
    llm = load_llm_for(config.model, ctx, config.batch_size, config.concurrency)
    cache: dict[str, str] = {}
    agrees = (lambda parametric, grounded: answer_matches(parametric, [grounded])) \
        if config.parametric_check == "evidence" else None
    found, retrievals, expansions, pairs_written = 0, 0, 0, 0
    with JsonlWriter(ctx.path("trajectories.jsonl")) as trajectories, JsonlWriter(ctx.path("pairs.jsonl")) as pairs:
        for item in ctx.progress(items, len(items), "tree search"):
            oracle = ModelOracle(llm, config, item, cache)
            result = tree_search(item.question, oracle, retrieve_for(item), lambda a: answer_matches(a, item.answers),
                                 config.max_depth, config.max_expansions, agrees, children=config.policy)
            expansions += result.expansions
            if result.trace is None:
                continue
            found += 1
            retrievals += result.trace.retrievals
            prompt = question_prompt(item.question, config.instruction, config.few_shot)
            trajectories.write({"id": item.id, "question": item.question, "answers": item.answers,
                                "prompt": prompt, "trace": result.trace.to_dict(), "text": render_trace(result.trace)})
            # the baselines' data (policy always/never) explored one decision per step: nothing to calibrate
            for pair in calibration_pairs(prompt, result.trace, config.pairs) if config.policy == "tree" else []:
                pairs.write({"id": item.id, **pair})
                pairs_written += 1
    require(found, "the tree search found no correct path for any question: check the model, index and answers")
    ctx.metrics.update({"policy": config.policy, "decompose": config.decompose, "parametric": config.parametric,
                        "parametric_check": config.parametric_check, "pairs_format": config.pairs,
                        "questions": len(items), "paths_found": found, "found_rate": found / len(items),
                        "retrievals_per_path": retrievals / found, "pairs": pairs_written,
                        "expansions_per_question": expansions / len(items)})
    return ctx.metrics


# ---------------------------------------------------------------- training


def _trace_from_dict(data: dict) -> Trace:
    steps = [Step(s["subquery"], s["answer"], s.get("retrieved"), s.get("alternative")) for s in data["steps"]]
    return Trace(question=data["question"], steps=steps, final=data.get("final"))


def load_synth(directory: str) -> tuple[list[dict], list[dict]]:
    from toolkit.data.text import read_jsonl

    root = Path(directory)
    require(root.is_dir(), f"training data must be a `rag deeprag synth` output directory: {directory}")
    trajectories = read_jsonl(root / "trajectories.jsonl", required=("prompt", "trace"))
    pairs_path = root / "pairs.jsonl"
    # the baselines' synthesis (policy always/never) writes an empty pairs.jsonl: nothing to calibrate
    has_pairs = pairs_path.exists() and pairs_path.read_text().strip()
    pairs = read_jsonl(pairs_path, required=("prompt", "chosen", "rejected")) if has_pairs else []
    return trajectories, pairs


def run_train(config: TrainConfig, ctx) -> dict:
    from toolkit.models.save import save_model
    from toolkit.models.source import load_model
    from toolkit.rag import training

    trajectories, pairs = load_synth(config.data)
    if "dpo" in config.stages:
        require(pairs, f"{config.data}/pairs.jsonl is missing or empty: stage II (dpo) needs calibration pairs")
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    pad_id = tokens.pad_id(tokenizer)
    cpu = ctx.device == "cpu"
    if "sft" in config.stages:
        examples = [training.encode_segments(tokenizer, training.trajectory_segments(
            t["prompt"], _trace_from_dict(t["trace"])), config.max_length) for t in trajectories]
        losses = training.train_sft(model, examples, pad_id, config.sft_epochs, config.sft_lr, config.batch_size,
                                    config.warmup_ratio, ctx.seed, cpu)
        ctx.metrics.update({"sft_examples": len(examples), "sft_steps": len(losses), "sft_loss_first": losses[0],
                            "sft_loss_last": sum(losses[-5:]) / len(losses[-5:])})
    if "dpo" in config.stages:
        reference = copy.deepcopy(model)
        encoded = [training.encode_pair(tokenizer, pair, config.max_length) for pair in pairs]
        log = training.train_dpo(model, reference, encoded, pad_id, config.dpo_epochs, config.dpo_lr,
                                 config.batch_size, config.dpo_beta, config.warmup_ratio, ctx.seed, cpu)
        tail = log[-5:]
        ctx.metrics.update({"dpo_pairs": len(pairs), "dpo_steps": len(log), "dpo_loss_first": log[0]["loss"],
                            "dpo_loss_last": sum(r["loss"] for r in tail) / len(tail),
                            "dpo_reward_accuracy_last": sum(r["reward_accuracy"] for r in tail) / len(tail)})
        del reference
    save_model(model, tokenizer, ctx.path("model"), technique="rag.deeprag", source=config.model, paper=PAPER,
               metadata={"technique": "deeprag", "stages": config.stages})
    return ctx.metrics


# ---------------------------------------------------------------- inference and baselines


def run_run(config: RunConfig, ctx) -> dict:
    items = load_qa(config.data, config.limit)
    retrieve_for = make_retrieve(config.index, items, config.top_k, config.passage_words)
    llm = load_llm_for(config.model, ctx, config.batch_size, config.concurrency)
    dataset = config.dataset_name or Path(config.data).stem
    item_retrieve = {item.id: retrieve_for(item) for item in items}
    rows = []
    for method in config.methods:
        runner = infer.Runner(llm, lambda item, query: item_retrieve[item.id](query), method, config.max_steps,
                              config.max_new_tokens, config.instruction, config.few_shot)
        episodes = runner.run(items, progress=lambda it, total, description: ctx.progress(it, total, description))
        scores = infer.score(episodes)
        rows.append({"dataset": dataset, "method": infer.METHOD_NAMES[method], **scores})
        write_jsonl(ctx.path(f"traces-{method}.jsonl"),
                    ({"id": episode.item.id, "answers": episode.item.answers, **episode.trace.to_dict(),
                      "lines": episode.lines} for episode in episodes))
    write_json(ctx.path("results.json"), {"rows": rows})
    ctx.metrics.update({row["method"]: {k: row[k] for k in ("em", "f1", "retrievals_per_question")} for row in rows})
    ctx.metrics["questions"] = len(items)
    return ctx.metrics

