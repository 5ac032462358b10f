"""A synthetic multi-hop knowledge base with gold decompositions, and a scripted policy that knows a chosen subset
of its facts — the controlled setting for DeepRAG's claim (retrieve only what the model does not know).

Relations: film -> director (person) -> birthplace (city) -> country. Questions are 2- and 3-hop compositions.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from toolkit.rag.search import NO_INFO
from toolkit.rag.trace import FINAL, FOLLOW, INTERMEDIATE, SEARCH, parse_trace

RELATIONS = {  # relation: (sub-question template, corpus statement template)
    "director": ("Who directed {s}?", "{s} is a film directed by {o}."),
    "birthplace": ("Where was {s} born?", "{s} was born in the city of {o}."),
    "country": ("Which country is {s} in?", "{s} is a city in the country of {o}."),
}
QUESTIONS = [  # (question template, relation chain) over a start entity
    ("Where was the director of {s} born?", ("director", "birthplace")),
    ("Which country was {s} born in?", ("birthplace", "country")),
    ("Which country was the director of {s} born in?", ("director", "birthplace", "country")),
]
SYLLABLES = ("ka ro mi ta ve lo sa ni du be ra to fe li mo zu ga pe ri no vu ha si te lu da ko me").split()
NOUNS = ("Harbor Winter Garden Signal River Crown Lantern Orchard Mirror Falcon Meadow Tower Ember Voyage "
         "Compass Island Thunder Shadow Valley Summit").split()


@dataclass(frozen=True)
class Fact:
    relation: str
    subject: str
    object: str

    @property
    def subquery(self) -> str:
        return RELATIONS[self.relation][0].format(s=self.subject)

    @property
    def statement(self) -> str:
        return RELATIONS[self.relation][1].format(s=self.subject, o=self.object)


@dataclass
class KnowledgeBase:
    facts: list[Fact]
    known: set[Fact]
    questions: list[dict] = field(default_factory=list)  # {id, question, answer, decomposition, hops, unknown_hops}

    def __post_init__(self):
        self.by_query = {f.subquery: f for f in self.facts}
        self.by_relation = {(f.relation, f.subject): f for f in self.facts}

    def corpus(self) -> list[dict]:
        return [{"id": f"f{i}", "title": f.subject, "text": f.statement} for i, f in enumerate(self.facts)]


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(syllables)).capitalize()


def _unique(rng: random.Random, make, n: int, taken: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = make()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def build_kb(films: int = 40, people: int = 30, cities: int = 16, countries: int = 5, known_fraction: float = 0.5,
             seed: int = 0, exclude: set[str] | None = None) -> KnowledgeBase:
    """Entities with unique made-up names (none in `exclude`), one fact per (relation, subject), a random
    `known_fraction` of facts marked known, and every 2- and 3-hop question the templates allow."""
    rng, taken = random.Random(seed), set(exclude or ())
    film_names = _unique(rng, lambda: f"{_name(rng, 2)} {rng.choice(NOUNS)}", films, taken)
    person_names = _unique(rng, lambda: f"{_name(rng, 2)} {_name(rng, 3)}", people, taken)
    city_names = _unique(rng, lambda: _name(rng, 3), cities, taken)
    country_names = _unique(rng, lambda: _name(rng, 2) + "ia", countries, taken)
    facts = ([Fact("director", f, rng.choice(person_names)) for f in film_names]
             + [Fact("birthplace", p, rng.choice(city_names)) for p in person_names]
             + [Fact("country", c, rng.choice(country_names)) for c in city_names])
    known = set(rng.sample(facts, round(known_fraction * len(facts))))
    kb = KnowledgeBase(facts=facts, known=known)
    starts = {"director": film_names, "birthplace": person_names}
    for template, chain in QUESTIONS:
        for subject in starts[chain[0]]:
            hops, entity = [], subject
            for relation in chain:
                hops.append(kb.by_relation[(relation, entity)])
                entity = hops[-1].object
            decomposition = [RELATIONS[chain[0]][0].format(s=subject)]
            decomposition += [RELATIONS[r][0].format(s="{%d}" % i) for i, r in enumerate(chain[1:], 1)]
            kb.questions.append({"id": f"q{len(kb.questions)}", "question": template.format(s=subject),
                                 "answer": entity, "decomposition": decomposition, "hops": len(chain),
                                 "unknown_hops": sum(h not in known for h in hops)})
    return kb


def fact_in_context(kb: KnowledgeBase, subquery: str, context: str) -> str | None:
    fact = kb.by_query.get(subquery.strip())
    return fact.object if fact is not None and fact.statement in context else None


class ScriptedPolicy:
    """A stand-in LLM reply function (for the loopback server) that follows the DeepRAG format exactly: it knows
    `kb.known`, retrieves for the rest, reads answers out of context, and answers the synthesis prompts."""

    def __init__(self, kb: KnowledgeBase):
        self.kb = kb

    def parametric(self, subquery: str) -> str:
        fact = self.kb.by_query.get(subquery.strip())
        return fact.object if fact is not None and fact in self.kb.known else "unknown"

    def __call__(self, prompt: str) -> str:
        reader = re.search(r"(Context:.*)\nQuestion: (.*)\nAnswer:$", prompt, re.S)
        if reader:
            return " " + (fact_in_context(self.kb, reader.group(2), reader.group(1)) or NO_INFO)
        single = re.search(r"^Question: (.*)\nAnswer:$", prompt, re.S)
        if single:
            return " " + self.parametric(single.group(1))
        head, _, body = prompt.rpartition("Question: ")
        question, _, trajectory = body.partition("\n")
        last = trajectory.rstrip("\n").rsplit("\n", 1)[-1] if trajectory.strip() else ""
        trace = parse_trace(question, trajectory)
        if prompt.endswith("<answer short>"):
            return (trace.steps[-1].answer if trace.steps else "unknown") + "</answer short>"
        if prompt.endswith(INTERMEDIATE):
            subquery = trajectory.split(FOLLOW)[-1].split("\n", 1)[0].strip()
            previous = trajectory.rsplit("\n", 2)[-2] if trajectory.count("\n") >= 1 else ""
            context = previous if previous.startswith("Context:") else ""
            return " " + (fact_in_context(self.kb, subquery, context) or self.parametric(subquery))
        if last.startswith(FOLLOW):
            subquery = last[len(FOLLOW):].strip()
            fact = self.kb.by_query.get(subquery)
            return f"{INTERMEDIATE} {fact.object}" if fact in self.kb.known else SEARCH
        return self.next_step(question, [s.answer for s in trace.steps]) + "\n"

    def next_step(self, question: str, answers: list[str]) -> str:
        entry = next((q for q in self.kb.questions if q["question"] == question), None)
        if entry is None or len(answers) >= len(entry["decomposition"]):
            return f"{FINAL} <answer short>{answers[-1] if answers else 'unknown'}</answer short>"
        template = entry["decomposition"][len(answers)]
        return f"{FOLLOW} " + template.format(None, *answers)


def entity_names(kb: KnowledgeBase) -> set[str]:
    return {f.subject for f in kb.facts} | {f.object for f in kb.facts}


def parametric_examples(kb: KnowledgeBase) -> list[str]:
    """What the base model is fine-tuned on: the known half of the facts, as single-hop QA."""
    return [f"Question: {f.subquery}\nAnswer: {f.object}" for f in kb.facts if f in kb.known]


KINDS = {"director": ("film", "person"), "birthplace": ("person", "city"), "country": ("city", "country")}


def entity_pools(sizes: dict[str, int], seed: int = 0, exclude: set[str] | None = None) -> dict[str, list[str]]:
    """Made-up names per entity kind (film, person, city, country), none in `exclude`."""
    rng, taken = random.Random(seed), set(exclude or ())
    makers = {"film": lambda: f"{_name(rng, 2)} {rng.choice(NOUNS)}", "person": lambda: f"{_name(rng, 2)} {_name(rng, 3)}",
              "city": lambda: _name(rng, 3), "country": lambda: _name(rng, 2) + "ia"}
    return {kind: _unique(rng, makers[kind], n, taken) for kind, n in sizes.items()}


def reading_examples(n: int, pools: dict[str, list[str]], passages: int = 2, seed: int = 0,
                     exclude: set[Fact] | None = None, step_fraction: float = 0.0) -> list[str]:
    """Reading comprehension over random pairings of pool entities (a new pairing every example, so the only skill
    that helps is copying from the context): the gold statement among distractors of the same relation, rendered
    the way retrieval renders passages. Pairings in `exclude` (the true KB facts, when the pools hold KB names so
    the reader learns to copy exactly those tokens) are never generated, so no KB fact leaks into the model. A
    `step_fraction` of the examples are one-step DeepRAG trajectories (question, follow-up, search line, context,
    intermediate answer, final line) instead of the reader prompt: inference reads in that format, and copying the
    entity from the question into the follow-up and the intermediate answer into the final line is the same skill."""
    from toolkit.rag.trace import render_context

    rng, exclude = random.Random(seed), exclude or set()
    examples = []
    while len(examples) < n:
        relation = rng.choice(list(RELATIONS))
        subject_kind, object_kind = KINDS[relation]
        subjects = rng.sample(pools[subject_kind], passages)
        facts = [Fact(relation, subject, rng.choice(pools[object_kind])) for subject in subjects]
        if exclude.intersection(facts):
            continue
        gold = facts[0]
        rng.shuffle(facts)
        context = render_context([f"{f.subject}: {f.statement}" for f in facts])
        if rng.random() < step_fraction:
            examples.append(f"Question: {gold.subquery}\n{FOLLOW} {gold.subquery}\n{SEARCH}\n{context}\n"
                            f"{INTERMEDIATE} {gold.object}\n{FINAL} <answer short>{gold.object}</answer short>")
        else:
            examples.append(f"{context}\nQuestion: {gold.subquery}\nAnswer: {gold.object}")
    return examples


# ---------------------------------------------------------------- pretraining texts for the paper-mode synthesis
#
# The paper's synthesis asks the base model itself to write sub-questions (few-shot decomposition prompt), to answer
# each one in-chain from memory, and to read passages under the "[No related Info]" reader instruction. A 1 M-param
# model trained from scratch has none of these skills; the texts below give them to it on random pairings that
# never state a fact the model is not supposed to know (the unknown half of the KB stays unknown).


def chain_examples(kb: KnowledgeBase) -> list[str]:
    """The known facts in the in-chain format ("Follow up: q / Intermediate answer: a"): the same parametric knowledge
    as `parametric_examples`, reachable where the paper's synthesis asks for it (after the chain so far)."""
    return [f"{FOLLOW} {f.subquery}\n{INTERMEDIATE} {f.object}" for f in kb.facts if f in kb.known]


def reader_examples(n: int, pools: dict[str, list[str]], reader_prompt: str, passages: int = 1, seed: int = 0,
                    exclude: set[Fact] | None = None, no_info_fraction: float = 0.2) -> list[str]:
    """Reading under the reader instruction (`reader_prompt` with {context} and {subquery}): copy the answer out of
    the passages, or answer "[No related Info]" when none of them is about the sub-question's subject (a
    `no_info_fraction` of the examples). Random pairings of pool entities; pairings in `exclude` never appear."""
    from toolkit.rag.trace import render_context

    rng, exclude = random.Random(seed), exclude or set()
    examples = []
    while len(examples) < n:
        relation = rng.choice(list(RELATIONS))
        subject_kind, object_kind = KINDS[relation]
        subjects = rng.sample(pools[subject_kind], passages + 1)
        facts = [Fact(relation, subject, rng.choice(pools[object_kind])) for subject in subjects]
        if exclude.intersection(facts):
            continue
        gold, shown = facts[0], facts[:passages]
        answer = gold.object
        if rng.random() < no_info_fraction:
            shown, answer = facts[1:], NO_INFO
        rng.shuffle(shown)
        context = render_context([f"{f.subject}: {f.statement}" for f in shown])
        examples.append(reader_prompt.format(context=context, subquery=gold.subquery) + f" {answer}")
    return examples


def decomposition_examples(n: int, kb: KnowledgeBase, pools: dict[str, list[str]], prefix: str, seed: int = 0,
                           retrieve_fraction: float = 0.5, kb_object_fraction: float = 0.0) -> list[str]:
    """Worked multi-hop chains in the DeepRAG step format under the decomposition prompt (`prefix` + "Question: q"):
    the question templates of the KB, started from a random non-KB entity (later hops may reach KB names), each hop retrieved (with a context
    passage) or answered from memory at random — the decision never depends on whether the model knows the fact,
    so no retrieval policy is taught here. A hop about a known KB fact carries its true object (the model knows it
    anyway); any other hop answered from memory carries a random non-KB name (an uninformed guess, so no unknown KB
    fact and no consistent false association is taught); a retrieved hop copies a random pairing from its passage
    (one passage, = top-1 retrieval; never an unknown KB fact). A `kb_object_fraction` of the random objects are KB
    names (the next hop is then about a KB entity, whose known facts are answered truly in-chain)."""
    from toolkit.rag.trace import render_context, render_final

    rng = random.Random(seed)
    kb_names = entity_names(kb)
    guesses = {kind: [name for name in names if name not in kb_names] for kind, names in pools.items()}
    kb_objects = {kind: [name for name in names if name in kb_names] for kind, names in pools.items()}

    def random_object(kind: str, fact: Fact | None) -> str:
        names = kb_objects[kind] if kb_objects[kind] and rng.random() < kb_object_fraction else guesses[kind]
        return rng.choice([o for o in names if fact is None or o != fact.object])

    starts = {"director": "film", "birthplace": "person"}
    examples = []
    while len(examples) < n:
        template, chain = rng.choice(QUESTIONS)
        subject = rng.choice(guesses[starts[chain[0]]])  # never a KB entity: no KB question appears here
        lines, entity = [], subject
        for relation in chain:
            object_kind = KINDS[relation][1]
            fact = kb.by_relation.get((relation, entity))
            subquery = RELATIONS[relation][0].format(s=entity)
            if rng.random() < retrieve_fraction:
                obj = fact.object if fact in kb.known else (
                    random_object(object_kind, fact) if kb_object_fraction else
                    rng.choice([o for o in pools[object_kind] if fact is None or o != fact.object]))
                context = render_context([f"{entity}: {Fact(relation, entity, obj).statement}"])
                lines += [f"{FOLLOW} {subquery}", SEARCH, context, f"{INTERMEDIATE} {obj}"]
            else:
                obj = fact.object if fact in kb.known else (
                    random_object(object_kind, fact) if kb_object_fraction else rng.choice(guesses[object_kind]))
                lines += [f"{FOLLOW} {subquery}", f"{INTERMEDIATE} {obj}"]
            entity = obj
        examples.append(prefix + f"Question: {template.format(s=subject)}\n" + "\n".join(lines) + "\n"
                        + render_final(entity))
    return examples
