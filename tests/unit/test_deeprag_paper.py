"""The paper-mode pieces of DeepRAG's synthesis (issue 27): minimum-retrieval priority, model-written sub-questions,
in-chain parametric answers, the reader's "[No related Info]" rule, generated final answers, decision pairs."""

import itertools
import re

import pytest

from toolkit.llm.base import LLM, Completion
from toolkit.rag import synthetic, training
from toolkit.rag.deeprag import ModelOracle, SynthConfig
from toolkit.rag.prompts import DECOMPOSE_INSTRUCTION, NO_INFO, READER_PROMPT
from toolkit.rag.qa import QAItem
from toolkit.rag.retrieval import BM25Retriever, Passage
from toolkit.rag.search import calibration_pairs, tree_search
from toolkit.rag.trace import FINAL, FOLLOW, INTERMEDIATE, SEARCH, Step, Trace, question_prompt

pytestmark = pytest.mark.usefixtures("one_thread")


class TableOracle:
    """Three fixed sub-questions; per sub-question a known parametric answer and a known reader answer. The final
    answer is correct iff every hop's answer is in `good` (so which paths are correct is known in advance)."""

    subqueries = ["q1", "q2", "q3"]

    def __init__(self, memory, reader, good):
        self.memory, self.reader, self.good = memory, reader, good

    def propose(self, question, steps):
        if len(steps) == 3:
            return "final", "RIGHT" if all(s.answer in self.good for s in steps) else "WRONG"
        return "follow", self.subqueries[len(steps)]

    def parametric(self, question, steps, subquery):
        return self.memory[subquery]

    def from_context(self, question, steps, subquery, passages):
        return self.reader[subquery]


def brute_force(oracle):
    """Fewest retrievals over every retrieve/parametric assignment that is correct (None: no correct one)."""
    best = None
    for choice in itertools.product([False, True], repeat=3):
        answers = [oracle.reader[q] if r else oracle.memory[q] for q, r in zip(oracle.subqueries, choice)]
        if NO_INFO in answers:
            continue
        if all(a in oracle.good for a in answers):
            best = sum(choice) if best is None else min(best, sum(choice))
    return best


@pytest.mark.parametrize("known", list(itertools.product([False, True], repeat=3)))
def test_search_pops_fewest_retrievals_first_and_returns_the_minimum(known):
    memory = {q: (f"a{q}" if k else f"guess{q}") for q, k in zip(TableOracle.subqueries, known)}
    reader = {q: f"a{q}" for q in TableOracle.subqueries}
    oracle = TableOracle(memory, reader, good={"aq1", "aq2", "aq3"})
    result = tree_search("Q", oracle, lambda q: [f"doc {q}"], lambda a: a == "RIGHT", max_expansions=100)
    assert result.popped == sorted(result.popped)  # the priority order: never a node with more retrievals first
    assert result.trace.retrievals == brute_force(oracle) == sum(not k for k in known)
    assert [s.retrieves for s in result.trace.steps] == [not k for k in known]
    assert all(r == result.trace.retrievals for r, a in result.explored if a == "RIGHT")


def test_search_minimum_with_a_pruned_reader_branch():
    # Only hop 3 is wrong from memory; the reader has nothing for hop 2 ("[No related Info]" prunes that child).
    oracle = TableOracle({"q1": "x", "q2": "y", "q3": "bad"}, {"q1": "z", "q2": NO_INFO, "q3": "w"},
                         good={"x", "y", "w", "z"})
    result = tree_search("Q", oracle, lambda q: ["doc"], lambda a: a == "RIGHT")
    assert [(s.answer, s.retrieves) for s in result.trace.steps] == [("x", False), ("y", False), ("w", True)]
    assert result.trace.retrievals == 1 == brute_force(oracle)
    assert result.popped == sorted(result.popped)


def test_baseline_children_keep_one_decision():
    oracle = TableOracle({"q1": "a", "q2": "b", "q3": "c"}, {"q1": "a", "q2": "b", "q3": "c"}, good={"a", "b", "c"})
    always = tree_search("Q", oracle, lambda q: ["doc"], lambda a: a == "RIGHT", children="always").trace
    never = tree_search("Q", oracle, lambda q: ["doc"], lambda a: a == "RIGHT", children="never").trace
    assert [s.retrieves for s in always.steps] == [True] * 3 and never.retrievals == 0
    pruned = TableOracle({"q1": "a", "q2": "b", "q3": "c"}, {"q1": "a", "q2": NO_INFO, "q3": "c"}, good={"a", "b", "c"})
    assert tree_search("Q", pruned, lambda q: ["doc"], lambda a: a == "RIGHT", children="always").trace is None
    with pytest.raises(ValueError):
        tree_search("Q", oracle, lambda q: [], lambda a: True, children="sometimes")


def test_decision_pairs_from_a_tree():
    oracle = TableOracle({"q1": "a", "q2": "guess", "q3": "c"}, {"q1": "a", "q2": "b", "q3": "c"}, good={"a", "b", "c"})
    trace = tree_search("Q", oracle, lambda q: [f"doc {q}"], lambda a: a == "RIGHT").trace
    assert [s.retrieves for s in trace.steps] == [False, True, False]
    prompt = question_prompt("Q")
    pairs = calibration_pairs(prompt, trace)
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [(INTERMEDIATE, SEARCH), (SEARCH, INTERMEDIATE),
                                                            (INTERMEDIATE, SEARCH)]
    assert pairs[0]["prompt"] == prompt + f"{FOLLOW} q1\n"
    assert pairs[1]["prompt"] == prompt + f"{FOLLOW} q1\n{INTERMEDIATE} a\n{FOLLOW} q2\n"
    assert pairs[2]["prompt"] == (prompt + f"{FOLLOW} q1\n{INTERMEDIATE} a\n{FOLLOW} q2\n{SEARCH}\n"
                                  f"Context: [1] doc q2\n{INTERMEDIATE} b\n{FOLLOW} q3\n")
    assert all(p["format"] == "decision" for p in pairs)


def test_decision_pair_encoding_scores_only_the_decision(tiny_tokenizer):
    pair = {"prompt": "Question: Q\nFollow up: q1\n", "chosen": SEARCH, "rejected": INTERMEDIATE, "format": "decision"}
    chosen, rejected = training.encode_pair(tiny_tokenizer, pair, 512)
    for encoded, text in ((chosen, SEARCH), (rejected, INTERMEDIATE)):
        trained = [t for t, label in zip(encoded["input_ids"], encoded["labels"]) if label != training.IGNORE]
        assert tiny_tokenizer.decode(trained) == text
    answer_pair = {**pair, "chosen": f"{INTERMEDIATE} a", "format": "answer"}
    encoded = training.encode_pair(tiny_tokenizer, answer_pair, 512)[0]
    trained = [t for t, label in zip(encoded["input_ids"], encoded["labels"]) if label != training.IGNORE]
    assert tiny_tokenizer.decode(trained) == f"{INTERMEDIATE} a\n"


class RecordingLLM(LLM):
    def __init__(self, reply):
        self.reply, self.prompts = reply, []

    def generate(self, prompts, max_new_tokens=64, temperature=0.0, stop=None, seed=0, chat=False):
        self.prompts += prompts
        return [Completion(text=self.reply(p)) for p in prompts]


def test_paper_defaults_and_reader_instruction():
    config = SynthConfig(model="m", data="d", index="i")
    assert (config.decompose, config.parametric, config.policy, config.pairs, config.parametric_check) == \
        ("model", "chain", "tree", "decision", "none")
    assert NO_INFO in config.reader_prompt == READER_PROMPT and "lacks relevant information" in READER_PROMPT
    assert config.decompose_instruction == DECOMPOSE_INSTRUCTION


def test_model_oracle_writes_subquestions_answers_in_chain_and_generates_the_final_answer():
    item = QAItem("1", "Where was the director of X born?", ["Rome"], decomposition=["GOLD-1?", "GOLD-2 {1}?"])

    def reply(prompt):
        if prompt.endswith("\nAnswer:"):  # the reader
            return " Ann" if "directed by Ann" in prompt else f" {NO_INFO}"
        if prompt.endswith(INTERMEDIATE):  # in-chain parametric
            return " Rome"
        if prompt.endswith("<answer short>"):
            return "Rome</answer short>"
        if prompt.endswith(f"{INTERMEDIATE} Rome\n"):
            return f"{FINAL} <answer short>Rome</answer short>"
        return f"{FOLLOW} Who directed X?" if prompt.endswith("born?\n") else f"{FOLLOW} Where was Ann born?"

    llm = RecordingLLM(reply)
    config = SynthConfig(model="m", data="d", index="i", decompose_few_shot="Question: demo\nFollow up: d?\n")
    oracle = ModelOracle(llm, config, item, {})
    kind, subquery = oracle.propose(item.question, [])
    assert (kind, subquery) == ("follow", "Who directed X?")  # the model's, not the gold decomposition
    assert llm.prompts[-1] == f"{DECOMPOSE_INSTRUCTION}Question: demo\nFollow up: d?\nQuestion: {item.question}\n"
    history = [Step("Who directed X?", "Ann", ["X: X is a film directed by Ann."])]
    assert oracle.parametric(item.question, history, "Where was Ann born?") == "Rome"
    assert llm.prompts[-1] == (oracle.prompt + f"{FOLLOW} Who directed X?\n{SEARCH}\nContext: [1] X: X is a film "
                               f"directed by Ann.\n{INTERMEDIATE} Ann\n{FOLLOW} Where was Ann born?\n{INTERMEDIATE}")
    assert oracle.from_context(item.question, [], "Who directed X?", ["X: X is a film directed by Ann."]) == "Ann"
    assert NO_INFO in llm.prompts[-1] and llm.prompts[-1].startswith(READER_PROMPT.split("{context}")[0])
    done = history + [Step("Where was Ann born?", "Rome")]
    assert oracle.propose(item.question, done) == ("final", "Rome")  # generated, not copied from the last hop
    gold = ModelOracle(llm, config.model_copy(update={"decompose": "gold"}), item, {})
    assert gold.propose(item.question, []) == ("follow", "GOLD-1?")
    assert gold.propose(item.question, [Step("a", "A"), Step("b", "B")]) == ("final", "Rome")
    assert llm.prompts[-1].endswith(f"{FINAL} <answer short>")


@pytest.fixture(scope="module")
def kb():
    return synthetic.build_kb(films=12, people=10, cities=6, countries=3, seed=5)


def test_paper_synthesis_with_a_scripted_model_retrieves_exactly_the_unknown_hops(kb):
    """Model-written sub-questions, in-chain parametric answers and the reader, all from one scripted LLM: the
    minimum-retrieval path retrieves exactly the facts the model does not know, for every question."""
    retriever = BM25Retriever([Passage(**row) for row in kb.corpus()])
    llm = RecordingLLM(synthetic.ScriptedPolicy(kb))
    config = SynthConfig(model="m", data="d", index="i")
    for question in kb.questions:
        item = QAItem(question["id"], question["question"], [question["answer"]])
        result = tree_search(item.question, ModelOracle(llm, config, item, {}),
                             lambda q: [p.render() for p, _ in retriever.search([q], 3)[0]],
                             lambda a: a == question["answer"])
        assert result.trace.final == question["answer"] and result.trace.retrievals == question["unknown_hops"]
        assert [s.subquery for s in result.trace.steps][:1] == [question["decomposition"][0]]
        for step in result.trace.steps:
            assert step.retrieves == (kb.by_query[step.subquery] not in kb.known)
    assert any(p.endswith(INTERMEDIATE) and p.startswith(DECOMPOSE_INSTRUCTION) for p in llm.prompts)
    assert any(p.startswith(READER_PROMPT.split("{context}")[0]) for p in llm.prompts)


def test_pretraining_texts_teach_skills_without_unknown_facts_or_kb_questions(kb):
    names = synthetic.entity_names(kb)
    pools = synthetic.entity_pools({"film": 20, "person": 20, "city": 10, "country": 5}, seed=1, exclude=names)
    for kind, extra in {"person": sorted({f.object for f in kb.facts if f.relation == "director"}),
                        "city": sorted({f.object for f in kb.facts if f.relation == "birthplace"})}.items():
        pools[kind] = pools[kind] + extra
    demos = synthetic.decomposition_examples(300, kb, pools, DECOMPOSE_INSTRUCTION, seed=0)
    biased = synthetic.decomposition_examples(300, kb, pools, DECOMPOSE_INSTRUCTION, seed=0, kb_object_fraction=0.8)
    in_chain = lambda texts: sum(f"{f.subquery}\n{INTERMEDIATE} {f.object}" in d for d in texts for f in kb.known)  # noqa: E731
    assert in_chain(biased) > in_chain(demos)
    demos = demos + biased
    questions = {q["question"] for q in kb.questions}
    unknown = [f for f in kb.facts if f not in kb.known]
    for demo in demos:
        assert demo.startswith(DECOMPOSE_INSTRUCTION + "Question: ") and demo.endswith("</answer short>")
        assert not any(q in demo for q in questions)
        for fact in unknown:  # an unknown fact is never stated, retrieved or answered
            assert fact.statement not in demo and f"{fact.subquery}\n{INTERMEDIATE} {fact.object}" not in demo
            assert f"{fact.subquery}\n{SEARCH}\nContext: [1] {fact.subject}: {fact.statement}" not in demo
    assert sum(SEARCH in d for d in demos) > 200 and sum(f"?\n{INTERMEDIATE}" in d for d in demos) > 200
    chains = synthetic.chain_examples(kb)
    assert len(chains) == len(kb.known) and all(f"{FOLLOW} {f.subquery}\n{INTERMEDIATE} {f.object}" in chains
                                                for f in kb.known)
    readers = synthetic.reader_examples(400, pools, READER_PROMPT, seed=0, exclude=set(kb.facts))
    no_info = [r for r in readers if r.endswith(NO_INFO)]
    assert 40 < len(no_info) < 120
    for example in readers:
        subquery = example.split("\nQuestion: ")[1].split("\n")[0]
        subject = next(m.group(1) for template, _ in synthetic.RELATIONS.values()
                       if (m := re.fullmatch(re.escape(template).replace(r"\{s\}", "(.+)"), subquery)))
        context = example.split("Context: ")[1].split("\nQuestion")[0]
        if example.endswith(NO_INFO):
            assert f"] {subject}: " not in context
        else:
            assert f"] {subject}: " in context and example.rsplit("Answer: ", 1)[1] in context
        assert not any(f.statement in example for f in kb.facts)


def test_trace_helpers_for_pairs():
    trace = Trace("Q", [Step("q1", "a", ["d"], alternative="g")], final="a")
    assert calibration_pairs("P", trace, "answer")[0]["rejected"] == f"{INTERMEDIATE} g"
    with pytest.raises(ValueError):
        calibration_pairs("P", trace, "both")


def test_bucket_sampler_covers_every_example_once_per_epoch_with_less_padding():
    lengths = [(i * 37) % 101 + 1 for i in range(200)]
    sampler = training.BucketSampler(lengths, batch_size=8, window=5, seed=0)
    for _ in range(2):
        batches = list(sampler)
        assert sorted(i for b in batches for i in b) == list(range(200)) and len(batches) == len(sampler)
        assert all(len(b) <= 8 for b in batches)
    plain = [list(range(i, i + 8)) for i in range(0, 200, 8)]
    padded = lambda bs: sum(max(lengths[i] for i in b) * len(b) for b in bs)  # noqa: E731
    assert padded(batches) < padded(plain)
    assert list(training.BucketSampler(lengths, 8, 5, seed=0)) == list(training.BucketSampler(lengths, 8, 5, seed=0))
