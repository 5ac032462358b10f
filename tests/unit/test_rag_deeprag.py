import itertools
import json

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.llm.base import LLM, Completion
from toolkit.rag import infer, training
from toolkit.rag.qa import QAItem, load_qa
from toolkit.rag.retrieval import BM25Retriever, Passage, load_index, save_index
from toolkit.rag.search import NO_INFO, calibration_pairs, tree_search
from toolkit.rag.synthetic import ScriptedPolicy, build_kb
from toolkit.rag.trace import (
    CONTEXT,
    FOLLOW,
    SEARCH,
    Step,
    Trace,
    extract_final,
    parse_trace,
    question_prompt,
    render_trace,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kb():
    return build_kb(films=12, people=10, cities=6, countries=3, seed=3)


@pytest.fixture(scope="module")
def retriever(kb):
    return BM25Retriever([Passage(**row) for row in kb.corpus()])


class ScriptedOracle:
    def __init__(self, kb, decomposition):
        self.kb, self.decomposition, self.policy = kb, decomposition, ScriptedPolicy(kb)

    def propose(self, question, steps):
        if len(steps) == len(self.decomposition):
            return "final", steps[-1].answer
        return "follow", self.decomposition[len(steps)].format(None, *[s.answer for s in steps])

    def parametric(self, question, steps, subquery):
        return self.policy.parametric(subquery)

    def from_context(self, question, steps, subquery, passages):
        fact = self.kb.by_query.get(subquery)
        return fact.object if fact and any(fact.statement in p for p in passages) else NO_INFO


def brute_force_min_retrievals(kb, question) -> int:
    """Enumerate every retrieve/parametric assignment over the gold hops; the fewest retrievals of a correct one."""
    policy, best = ScriptedPolicy(kb), None
    for choice in itertools.product([False, True], repeat=len(question["decomposition"])):
        answers = []
        for template, retrieve in zip(question["decomposition"], choice):
            fact = kb.by_query.get(template.format(None, *answers))
            answers.append(fact.object if (retrieve and fact) else policy.parametric(template.format(None, *answers)))
        if answers[-1] == question["answer"]:
            best = sum(choice) if best is None else min(best, sum(choice))
    return best


def test_tree_search_finds_the_minimum_retrieval_correct_path(kb, retriever):
    retrieve = lambda q: [p.render() for p, _ in retriever.search([q], 3)[0]]  # noqa: E731
    for question in kb.questions:
        result = tree_search(question["question"], ScriptedOracle(kb, question["decomposition"]), retrieve,
                             lambda a: a == question["answer"])
        assert result.trace is not None and result.trace.final == question["answer"]
        assert result.trace.retrievals == question["unknown_hops"] == brute_force_min_retrievals(kb, question)
        for step in result.trace.steps:  # exactly the unknown facts were retrieved
            assert step.retrieves == (kb.by_query[step.subquery] not in kb.known)


def test_tree_search_gives_up_without_a_correct_path(kb):
    question = kb.questions[0]
    result = tree_search(question["question"], ScriptedOracle(kb, question["decomposition"]), lambda q: [],
                         lambda a: False, max_expansions=10)
    assert result.trace is None and result.expansions <= 10


class LuckyGuessOracle:
    """Two hops; the model guesses hop 1 wrong ("Wrong" instead of "Right"), yet both men were born in Rome, so the
    all-parametric path reaches the gold answer by luck. Nothing is retrievable about the wrong man."""

    memory = {"Who directed X?": "Wrong", "Where was Wrong born?": "Rome", "Where was Right born?": "Rome"}
    passages = {"Who directed X?": "Right", "Where was Right born?": "Rome"}

    def propose(self, question, steps):
        if len(steps) == 2:
            return "final", steps[-1].answer
        return ("follow", "Who directed X?") if not steps else ("follow", f"Where was {steps[0].answer} born?")

    def parametric(self, question, steps, subquery):
        return self.memory[subquery]

    def from_context(self, question, steps, subquery, passages):
        return self.passages.get(subquery, NO_INFO)


def test_evidence_check_prunes_lucky_parametric_guesses():
    def search(agrees):
        return tree_search("Where was the director of X born?", LuckyGuessOracle(), lambda q: [q],
                           lambda a: a == "Rome", agrees=agrees).trace

    paper = search(None)  # judged by the final answer only: the lucky guess is the minimum-retrieval path
    assert paper.retrievals == 0 and [s.answer for s in paper.steps] == ["Wrong", "Rome"]
    checked = search(lambda parametric, grounded: parametric == grounded)
    assert [(s.answer, s.retrieves) for s in checked.steps] == [("Right", True), ("Rome", False)]
    pairs = calibration_pairs(question_prompt(checked.question), checked, "answer")
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [(SEARCH, "Intermediate answer: Wrong"),
                                                            ("Intermediate answer: Rome", SEARCH)]


def test_answer_pairs_condition_on_the_subquestion_not_the_question():
    trace = Trace("Where was the director of X born?",
                  [Step("Who directed X?", "Ann", ["X: X is a film directed by Ann."], alternative="Bob"),
                   Step("Where was Ann born?", "Rome", None, alternative="Oslo")], final="Rome")
    prompt = question_prompt(trace.question)
    pairs = calibration_pairs(prompt, trace, "answer")
    assert pairs[0]["prompt"] == prompt + "Follow up: Who directed X?\n"
    assert (pairs[0]["chosen"], pairs[0]["rejected"]) == (SEARCH, "Intermediate answer: Bob")
    assert pairs[1]["prompt"].endswith("Intermediate answer: Ann\nFollow up: Where was Ann born?\n")
    assert (pairs[1]["chosen"], pairs[1]["rejected"]) == ("Intermediate answer: Rome", SEARCH)
    assert all(not p["prompt"].endswith(f"{FOLLOW} {trace.question}\n") for p in pairs)


def test_trace_round_trip_and_malformed_output():
    trace = Trace("q?", [Step("a?", "A", ["t1: one", "t2: two"]), Step("b A?", "B")], final="B")
    parsed = parse_trace("q?", render_trace(trace))
    assert parsed.steps == trace.steps and parsed.final == "B" and parsed.retrievals == 1
    messy = ("garbage\nIntermediate answer: orphan\nFollow up: Let me think?\nLet's search the question in "
             "Wikipedia.\nContext: [1] doc\nFollow up: who?\nIntermediate answer: X\n\nSo the final answer is: X")
    parsed = parse_trace("q", messy)
    assert [s.subquery for s in parsed.steps] == ["who?"] and not parsed.steps[0].retrieves
    assert parsed.final == "X" and "garbage" in parsed.malformed
    for text in ["", "\n\n", "Context: [1] x", "So the final answer is:", "Follow up:"]:
        parse_trace("q", text)  # total: never raises
    assert extract_final("So the final answer is: <answer long>l</answer long><answer short> Rome </answer short>") == "Rome"
    assert extract_final("So the final answer is: Paris.") == "Paris"


def test_bm25_save_load_identical_and_recall(kb, retriever, tmp_path):
    queries = [f.subquery for f in kb.facts]
    save_index(retriever, tmp_path / "idx")
    reloaded = load_index(tmp_path / "idx")
    assert [[(p.id, round(s, 5)) for p, s in r] for r in retriever.search(queries, 3)] == \
           [[(p.id, round(s, 5)) for p, s in r] for r in reloaded.search(queries, 3)]
    hits = [any(f.statement in p.text for p, _ in r) for f, r in zip(kb.facts, reloaded.search(queries, 3))]
    assert sum(hits) / len(hits) >= 0.95
    assert reloaded.search(["the of and"], 3) == [[]]  # stopwords only: nothing, no crash


def test_sft_masks_every_context_token(tiny_tokenizer):
    trace = Trace("q?", [Step("a?", "A", ["t1: one two", "t2: three"]), Step("b?", "B")], final="B")
    segments = training.trajectory_segments(question_prompt("q?"), trace)
    encoded = training.encode_segments(tiny_tokenizer, segments, 4096)
    spans = training.context_token_spans(tiny_tokenizer, segments)
    assert spans and all(encoded["labels"][i] == training.IGNORE for span in spans for i in span)
    prompt_len = len(tiny_tokenizer(segments[0][0], add_special_tokens=False)["input_ids"])
    assert all(label == training.IGNORE for label in encoded["labels"][:prompt_len])
    masked = set(range(prompt_len)) | {i for span in spans for i in span}
    trained = [i for i in range(len(encoded["labels"])) if i not in masked]
    assert trained and all(encoded["labels"][i] == encoded["input_ids"][i] for i in trained)
    text = tiny_tokenizer.decode([encoded["input_ids"][i] for span in spans for i in span])
    assert text.startswith(CONTEXT)


def test_dpo_loss_and_sequence_logprob_match_direct_formulas(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    pc, pr, rc, rr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]), \
        torch.tensor([-1.5, -2.0])
    expected = sum(-torch.log(1 / (1 + torch.exp(-0.4 * ((a - c) - (b - d))))) for a, b, c, d in zip(pc, pr, rc, rr)) / 2
    assert training.dpo_loss(pc, pr, rc, rr, 0.4).item() == pytest.approx(expected.item(), rel=1e-6)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    example = {"input_ids": [5, 6, 7, 8], "labels": [training.IGNORE, training.IGNORE, 7, 8]}
    batch = training.collate([example], 0)
    with torch.no_grad():
        logp = model(torch.tensor([[5, 6, 7, 8]])).logits[0].log_softmax(-1)
        direct = logp[1, 7] + logp[2, 8]
        assert training.sequence_logprob(model, batch).item() == pytest.approx(direct.item(), abs=1e-5)


class PolicyLLM(LLM):
    """The scripted policy behind the LLM interface (no server)."""

    def __init__(self, policy):
        self.policy = policy

    def generate(self, prompts, max_new_tokens=64, temperature=0.0, stop=None, seed=0, chat=False):
        return [Completion(text=self.policy(p)) for p in prompts]


def test_scripted_policy_deeprag_beats_baselines(kb, retriever):
    items = [QAItem(q["id"], q["question"], [q["answer"]], q["decomposition"]) for q in kb.questions]
    retrieve = lambda item, q: [p.render() for p, _ in retriever.search([q], 3)[0]]  # noqa: E731
    scores = {m: infer.score(infer.Runner(PolicyLLM(ScriptedPolicy(kb)), retrieve, m).run(items))
              for m in infer.METHODS}
    all_known = sum(q["unknown_hops"] == 0 for q in kb.questions) / len(kb.questions)
    assert scores["deeprag"]["em"] == 1.0 == scores["always"]["em"]
    assert scores["deeprag"]["retrievals_per_question"] == pytest.approx(
        sum(q["unknown_hops"] for q in kb.questions) / len(kb.questions))
    assert scores["deeprag"]["retrievals_per_question"] < scores["always"]["retrievals_per_question"]
    assert scores["never"]["em"] == pytest.approx(all_known) and scores["never"]["retrievals_per_question"] == 0
    assert scores["single"]["retrievals_per_question"] == 1.0


def test_runner_survives_malformed_model_output():
    replies = iter(["Follow up: Let it be?", "nonsense decision", "Follow up: again?", "Let's search now",
                    " X", "blah", "Y</answer short>"])

    class Scripted(LLM):
        def generate(self, prompts, **kwargs):
            return [Completion(text=next(replies) + "\nextra line") for _ in prompts]

    item = QAItem("1", "q?", ["Y"])
    episode = infer.Runner(Scripted(), lambda i, q: ["doc"], "deeprag").run([item])[0]
    assert episode.trace.final == "Y" and episode.trace.retrievals == 1
    assert [s.subquery for s in episode.trace.steps] == ["Let it be?", "again?"]
    assert episode.trace.malformed == ["nonsense decision", "blah"]


def test_qa_loaders_hotpot_nq_plain_and_bad_input(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"question_id": "h1", "question_text": "Q1?", "answers_objects": [{"spans": ["A1"]}],
             "contexts": [{"id": "0", "title": "T", "paragraph_text": "P", "is_supporting": True}]},
            {"id": "n1", "question": "q2", "golden_answers": ["a", "b"]},
            {"question": "q3", "answer": "c", "decomposition": ["Who?", "Where {1}?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    items = load_qa(path)
    assert [i.answers for i in items] == [["A1"], ["a", "b"], ["c"]]
    assert items[0].contexts[0].render() == "T: P" and items[2].decomposition == ["Who?", "Where {1}?"]
    for bad in ['{"question": "q"}', '{"question": "", "answer": "a"}', '{"question": "q", "answer": "a", '
                '"decomposition": "x"}', '{not json']:
        path.write_text(bad)
        with pytest.raises(BadInputError):
            load_qa(path)


def test_benchmark_pretraining_text_holds_only_known_facts_and_copyable_reading(kb):
    from toolkit.rag.synthetic import entity_names, entity_pools, parametric_examples, reading_examples

    texts = "\n".join(parametric_examples(kb))
    assert all((f.subquery in texts) == (f in kb.known) for f in kb.facts)
    pools = entity_pools({"film": 5, "person": 5, "city": 4, "country": 3}, seed=1, exclude=entity_names(kb))
    assert not entity_names(kb) & {n for names in pools.values() for n in names}
    for example in reading_examples(50, pools, passages=2, seed=0):
        context, answer = example.rsplit(" ", 1)[0], example.rsplit("\n", 1)[1].split(":", 1)[1].strip()
        assert answer in context and "Context: [1]" in example and "[2]" in example


def test_reading_examples_on_kb_names_never_state_a_true_fact(kb):
    from toolkit.rag.synthetic import KINDS, reading_examples
    from toolkit.rag.trace import FOLLOW, INTERMEDIATE, SEARCH, render_final

    pools: dict[str, set[str]] = {}
    for fact in kb.facts:
        for kind, name in zip(KINDS[fact.relation], (fact.subject, fact.object)):
            pools.setdefault(kind, set()).add(name)
    examples = reading_examples(300, {k: sorted(v) for k, v in pools.items()}, passages=1, seed=3,
                                exclude=set(kb.facts), step_fraction=0.5)
    assert not any(fact.statement in example for fact in kb.facts for example in examples)
    steps = [e for e in examples if FOLLOW in e]
    assert 100 < len(steps) < 200
    for example in steps:
        lines = example.split("\n")
        assert lines[1] == f"{FOLLOW} {lines[0][len('Question: '):]}" and lines[2] == SEARCH
        assert lines[3].startswith("Context: [1]") and lines[4].startswith(INTERMEDIATE)
        answer = lines[4][len(INTERMEDIATE):].strip()
        assert answer in lines[3] and lines[5] == render_final(answer)
