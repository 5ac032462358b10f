"""Benchmark setup: the synthetic multi-hop KB (corpus = all facts), a train/test question split, and a tiny GPT-2
trained here from scratch whose parametric knowledge is the known half of the facts plus a reading skill learned on
a disjoint KB. Writes OUT/{corpus,train,val,test}.jsonl, OUT/base/ (HF model dir) and OUT/setup.json."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch

from toolkit.rag import synthetic, training
from toolkit.rag.prompts import NO_INFO, READER_PROMPT
from toolkit.rag.trace import FINAL, FOLLOW, INSTRUCTION, INTERMEDIATE, SEARCH, render_context
from toolkit.zoo.lm import train_tokenizer

# The decomposition instruction for the tiny model (the paper's prompt, shortened: sequence length is CPU time).
KB_DECOMPOSE_INSTRUCTION = "Decompose the question into simple sub-questions and answer them one by one.\n"
KB_INSTRUCTION = "Answer step by step; search for facts you do not know.\n"  # = examples/deeprag/kb.yaml


def write_jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


@torch.no_grad()
def accuracy(model, tokenizer, prompts: list[str], answers: list[str]) -> float:
    from toolkit.llm.hf import HFBackend

    llm = HFBackend("base", model=model, tokenizer=tokenizer, batch_size=32)
    outputs = llm.generate(prompts, max_new_tokens=12, stop=["\n"])
    return sum(o.text.strip() == a for o, a in zip(outputs, answers)) / max(len(answers), 1)


def kb_kinds(kb) -> dict[str, list[str]]:
    """KB entity names by kind (film, person, city, country)."""
    kinds: dict[str, set[str]] = {}
    for fact in kb.facts:
        subject_kind, object_kind = synthetic.KINDS[fact.relation]
        kinds.setdefault(subject_kind, set()).add(fact.subject)
        kinds.setdefault(object_kind, set()).add(fact.object)
    return {kind: sorted(names) for kind, names in kinds.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--films", type=int, default=60)
    parser.add_argument("--people", type=int, default=40)
    parser.add_argument("--cities", type=int, default=20)
    parser.add_argument("--countries", type=int, default=6)
    parser.add_argument("--test-fraction", type=float, default=0.4)
    parser.add_argument("--val-fraction", type=float, default=0.15, help="held out of the train questions for "
                        "choosing the training configuration (the test questions never change)")
    parser.add_argument("--base-from", help="a setup directory this script wrote earlier with the same arguments: "
                        "reuse its trained base model and probes instead of pretraining again (deterministic anyway)")
    parser.add_argument("--reading", type=int, default=5000)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--reading-kb-names", type=int, default=1, help="1: reading pairings also use KB names")
    parser.add_argument("--step-fraction", type=float, default=0.5, help="reading examples in the step format")
    parser.add_argument("--passages", type=int, default=1, help="passages per reading example (= top_k later)")
    parser.add_argument("--paper-skills", type=int, default=1, help="1: also pretrain what the paper's synthesis "
                        "asks of the base model: decomposition demonstrations under the few-shot decomposition "
                        "prompt, known facts in the in-chain format, reading under the [No related Info] rule")
    parser.add_argument("--decompositions", type=int, default=1500)
    parser.add_argument("--init-from", help="a setup directory this script wrote with the same arguments: continue "
                        "pretraining its base model for --epochs more epochs (fresh warm-up and cosine schedule)")
    parser.add_argument("--kb-object-fraction", type=float, default=0.0, help="decomposition demonstrations: share "
                        "of random objects that are KB names (so later hops meet known KB facts in-chain)")
    parser.add_argument("--bucket", type=int, default=0, help="batch examples of similar length (windows of N "
                        "batches): less padding, less CPU; 0 = plain shuffling as in earlier rounds")
    parser.add_argument("--reader", type=int, default=2000)
    parser.add_argument("--chain-repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kb = synthetic.build_kb(args.films, args.people, args.cities, args.countries, seed=args.seed)
    questions = list(kb.questions)
    random.Random(args.seed).shuffle(questions)
    n_test = round(args.test_fraction * len(questions))
    n_val = round(args.val_fraction * len(questions))
    write_jsonl(out / "corpus.jsonl", kb.corpus())
    write_jsonl(out / "test.jsonl", questions[:n_test])
    write_jsonl(out / "val.jsonl", questions[n_test:n_test + n_val])
    write_jsonl(out / "train.jsonl", questions[n_test + n_val:])
    split = {"test_questions": n_test, "val_questions": n_val, "train_questions": len(questions) - n_test - n_val}
    if args.base_from:
        earlier = Path(args.base_from)
        shutil.copytree(earlier / "base", out / "base", dirs_exist_ok=True)
        if (earlier / "synth.yaml").exists():
            shutil.copy(earlier / "synth.yaml", out / "synth.yaml")
        stats = {**json.loads((earlier / "setup.json").read_text()), **split, "base_from": str(earlier)}
        (out / "setup.json").write_text(json.dumps(stats, indent=2))
        print(json.dumps(stats, indent=2))
        return

    known = synthetic.parametric_examples(kb)
    kb_names = synthetic.entity_names(kb)
    pools = synthetic.entity_pools({"film": 150, "person": 150, "city": 80, "country": 30}, seed=args.seed + 1,
                                   exclude=kb_names)
    if args.reading_kb_names:  # copy practice on the very tokens the reader must copy later, never a true pairing
        for kind, names in kb_kinds(kb).items():
            pools[kind] = pools[kind] + names
    reading = synthetic.reading_examples(args.reading, pools, passages=args.passages, seed=args.seed,
                                         exclude=set(kb.facts), step_fraction=args.step_fraction)
    texts = known * args.repeat + reading
    earlier_round = 1 if args.init_from else 0
    few_shot = ""
    if args.paper_skills:
        # the few-shot example of the decomposition prompt: the shortest of a few demonstrations (sequence length)
        few_shot = min(synthetic.decomposition_examples(20, kb, pools, "", seed=args.seed + 7), key=len) + "\n"
        prefix = KB_DECOMPOSE_INSTRUCTION + few_shot
        texts += synthetic.chain_examples(kb) * args.chain_repeat
        texts += synthetic.reader_examples(args.reader, pools, READER_PROMPT, passages=args.passages, seed=args.seed,
                                           exclude=set(kb.facts))
        texts += synthetic.decomposition_examples(args.decompositions, kb, pools, prefix, seed=args.seed + earlier_round,
                                                  kb_object_fraction=args.kb_object_fraction)
        (out / "synth.yaml").write_text(json.dumps({"decompose_instruction": KB_DECOMPOSE_INSTRUCTION,
                                                    "decompose_few_shot": few_shot,
                                                    "instruction": KB_INSTRUCTION}, indent=2) + "\n")
    vocab_text = "\n\n".join(texts + [INSTRUCTION, KB_DECOMPOSE_INSTRUCTION, READER_PROMPT, FINAL, render_context(["x"])] + [f.statement for f in kb.facts]
                             + [q["question"] for q in kb.questions] + [f"{f.subquery} {f.object}" for f in kb.facts])
    if args.init_from:  # continue pretraining an earlier base of this setup (same texts, same tokenizer)
        from transformers import AutoTokenizer, GPT2LMHeadModel

        tokenizer = AutoTokenizer.from_pretrained(Path(args.init_from) / "base")
        model = GPT2LMHeadModel.from_pretrained(Path(args.init_from) / "base")
        earlier_steps = json.loads((Path(args.init_from) / "setup.json").read_text())["pretrain_steps"]
    else:
        earlier_steps = 0
        tokenizer = train_tokenizer(vocab_text, vocab_size=600)
        # Every entity is one token, so a fact is a one-token association and reading is one-token copying: learnable
        # by a 1M-parameter model in a few minutes of CPU.
        tokenizer.add_tokens(sorted(kb_names | {name for names in pools.values() for name in names}))
        tokenizer.add_tokens([FOLLOW, INTERMEDIATE, SEARCH, FINAL, "<answer short>", "</answer short>", "Context:", NO_INFO])
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=len(tokenizer), n_positions=512, n_embd=128, n_layer=4, n_head=4,
                            bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
        model = GPT2LMHeadModel(config)
    examples = [training.encode_segments(tokenizer, [(t, True)], 512) for t in texts]
    started = time.time()

    def report(step: int, total: int, loss: float) -> None:
        if step % 50 == 0 or step == total:
            print(f"pretrain step {step}/{total} loss {loss:.3f} ({time.time() - started:.0f}s)", file=sys.stderr)

    losses = training.train_sft(model, examples, tokenizer.eos_token_id, args.epochs, 2e-3, 32, 0.05,
                                args.seed + earlier_steps,
                                on_step=report, bucket=args.bucket)
    seconds = time.time() - started
    model.save_pretrained(out / "base")
    tokenizer.save_pretrained(out / "base")

    def probe(facts, reading_format: bool) -> float:
        others = {f: [d for d in kb.facts if d.relation == f.relation and d != f][:args.passages - 1] for f in facts}
        prompts = [(render_context([f"{d.subject}: {d.statement}" for d in [f] + others[f]]) + "\n"
                    if reading_format else "")
                   + f"Question: {f.subquery}\nAnswer:" for f in facts]
        return accuracy(model, tokenizer, prompts, [f.object for f in facts])

    known_facts = [f for f in kb.facts if f in kb.known]
    unknown_facts = [f for f in kb.facts if f not in kb.known]
    stats = {"facts": len(kb.facts), "known_facts": len(known_facts), "questions": len(questions),
             **split,
             "all_known_fraction_test": sum(q["unknown_hops"] == 0 for q in questions[:n_test]) / n_test,
             "params": sum(p.numel() for p in model.parameters()), "pretrain_examples": len(texts),
             "pretrain_steps": earlier_steps + len(losses), "init_from": args.init_from, "pretrain_loss_last": sum(losses[-10:]) / 10, "pretrain_s": seconds,
             "closed_book_acc_known": probe(known_facts, False), "closed_book_acc_unknown": probe(unknown_facts, False),
             "reading_acc_kb": probe(kb.facts, True)}
    if args.paper_skills:
        chain = [f"{KB_DECOMPOSE_INSTRUCTION}{few_shot}Question: x\n{FOLLOW} {f.subquery}\n{INTERMEDIATE}" for f in kb.facts]
        reader = [READER_PROMPT.format(context=render_context([f"{f.subject}: {f.statement}"]), subquery=f.subquery)
                  for f in kb.facts]
        wrong = [READER_PROMPT.format(context=render_context([f"{g.subject}: {g.statement}"]), subquery=f.subquery)
                 for f, g in zip(kb.facts, kb.facts[1:] + kb.facts[:1])]
        train_q = [json.loads(line) for line in open(out / "train.jsonl")]
        first = [f"{KB_DECOMPOSE_INSTRUCTION}{few_shot}Question: {q['question']}\n" for q in train_q]
        stats.update({
            "in_chain_acc_known": accuracy(model, tokenizer, [c for c, f in zip(chain, kb.facts) if f in kb.known],
                                           [f.object for f in known_facts]),
            "in_chain_acc_unknown": accuracy(model, tokenizer, [c for c, f in zip(chain, kb.facts) if f not in kb.known],
                                             [f.object for f in unknown_facts]),
            "reader_acc_kb": accuracy(model, tokenizer, reader, [f.object for f in kb.facts]),
            "reader_no_info_acc": accuracy(model, tokenizer, wrong, [NO_INFO] * len(wrong)),
            "first_follow_up_acc_train": accuracy(model, tokenizer, first,
                                                  [f"{FOLLOW} {q['decomposition'][0]}" for q in train_q]),
            "decompositions": args.decompositions, "reader": args.reader, "chain_repeat": args.chain_repeat})
    (out / "setup.json").write_text(json.dumps(stats, indent=2))
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
