"""CoT study: KB invariants, target encoding, logit-lens ranks vs brute force, a short training smoke test."""

import pytest
import torch

from toolkit.study.cot import (
    Vocab,
    bridge_ranks,
    build_model,
    encode,
    first_resolved_layer,
    make_knowledge_base,
    to_batch,
    train_one,
)
from toolkit.study.cot_config import CotConfig

pytestmark = pytest.mark.usefixtures("one_thread")


SMALL = {"n_entities": 60, "n_relations": 8, "out_degree": 4, "ood_fraction": 0.2, "n_test": 50}


def test_knowledge_base_invariants():
    config = CotConfig(**SMALL)
    kb = make_knowledge_base(config, seed=0)
    assert len(kb.facts) == 60 * 4
    train = {item[:4] for item in kb.train_twohop}
    for head, r1, r2, bridge, tail in kb.train_twohop:
        assert kb.facts[(head, r1)] == bridge and (bridge, r2) in kb.facts
        assert (head, r1) not in kb.ood and (bridge, r2) not in kb.ood
        assert tail == kb.facts[(bridge, r2)]  # no label noise by default
    for head, r1, r2, bridge, tail in kb.test_ood:
        assert (head, r1) in kb.ood and (bridge, r2) in kb.ood
        assert kb.facts[(head, r1)] == bridge and kb.facts[(bridge, r2)] == tail
    assert not {item[:4] for item in kb.test_iid} & train
    assert len(kb.train_twohop) <= round(config.phi * (len(kb.facts) - len(kb.ood)))


def test_label_noise_changes_only_tails():
    clean = make_knowledge_base(CotConfig(**SMALL), seed=3)
    noisy = make_knowledge_base(CotConfig(**SMALL, label_noise=0.5), seed=3)
    assert [i[:4] for i in clean.train_twohop] == [i[:4] for i in noisy.train_twohop]
    changed = sum(a[4] != b[4] for a, b in zip(clean.train_twohop, noisy.train_twohop))
    assert 0.3 * len(clean.train_twohop) < changed < 0.6 * len(clean.train_twohop)


def test_cot_and_plain_targets():
    config = CotConfig(**SMALL)
    kb = make_knowledge_base(config, seed=0)
    vocab = Vocab(config.n_entities, config.n_relations)
    head, r1, r2, bridge, tail = kb.train_twohop[0]
    for cot, expected in ((True, [bridge, tail, vocab.end]), (False, [tail, vocab.end])):
        sequences, starts = encode(kb, vocab, cot)
        index = len(kb.facts)  # two-hop items follow the atomic ones
        assert sequences[index][:3] == [head, vocab.relation(r1), vocab.relation(r2)]
        assert sequences[index][starts[index]:] == expected
        _, labels = to_batch(sequences, starts, vocab)
        assert (labels[index, :3] == -100).all() and labels[index, 3:3 + len(expected)].tolist() == expected


def test_logit_lens_ranks_match_brute_force():
    config = CotConfig(**SMALL, n_layer=2, n_embd=32, n_head=2)
    kb = make_knowledge_base(config, seed=0)
    vocab = Vocab(config.n_entities, config.n_relations)
    torch.manual_seed(0)
    model = build_model(config, vocab).eval()
    items = kb.test_iid[:7]
    ranks = bridge_ranks(model, items, vocab)
    ids = torch.tensor([[h, vocab.relation(a), vocab.relation(b)] for h, a, b, _, _ in items])
    with torch.no_grad():
        final = model(ids).logits[:, 2]
        states = model(ids, output_hidden_states=True).hidden_states
        first = model.lm_head(model.transformer.ln_f(states[1]))[:, 1]
    brute_final = [sorted(row.tolist(), reverse=True).index(row[b].item()) for row, (*_, b, _) in zip(final, items)]
    brute_first = [sorted(row.tolist(), reverse=True).index(row[b].item()) for row, (*_, b, _) in zip(first, items)]
    assert ranks["r2"][-1] == float(torch.tensor(brute_final, dtype=torch.float).median())
    assert ranks["r1"][1] == float(torch.tensor(brute_first, dtype=torch.float).median())
    assert len(ranks["r1"]) == config.n_layer + 1


def test_first_resolved_layer():
    ranks = {"r1": [5, 0, 0, 0], "r2": [9, 3, 0, 0]}
    assert first_resolved_layer(ranks) == 2 and first_resolved_layer(ranks, "r1") == 1
    assert first_resolved_layer(ranks, "either") == 1
    assert first_resolved_layer({"r1": [5, 2, 1], "r2": [9, 3, 1]}) == 3


def test_short_training_learns_atomic_facts():
    config = CotConfig(n_entities=30, n_relations=6, out_degree=3, ood_fraction=0.3, n_test=40, n_layer=2,
                       n_embd=64, n_head=2, steps=240, batch_size=64, lr=3e-3, warmup=10, eval_every=80)
    kb = make_knowledge_base(config, seed=0)
    result = train_one(config, kb, Vocab(30, 6), True, seed=0, progress=lambda it, n, d: it)
    history = result["history"]
    assert history[-1]["loss"] < 1.5
    assert history[-1]["id_atomic"] > history[0]["id_atomic"] and history[-1]["id_atomic"] > 0.3


@pytest.mark.parametrize("bad", [{"n_embd": 30, "n_head": 4}, {"out_degree": 9, "n_relations": 8},
                                 {"modes": []}, {"modes": ["cot", "both"]}, {"ood_fraction": 1.0}])
def test_bad_configs(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        CotConfig(**{**SMALL, **bad})
