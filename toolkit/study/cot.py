"""CoT training and compositional generalisation on a synthetic two-hop knowledge base (`iclrkit study cot`).

Paper: Yao, Ren, Liao, Ding, Liu, "Compositional Generalization from Learned Skills via CoT Training: A Theoretical
and Structural Analysis for Reasoning" (ICLR 2026), https://arxiv.org/abs/2502.04667.
Official code: https://github.com/chen123CtrlS/T-CotMechanism (read to learn the protocol; nothing copied).

Protocol: every atomic fact `h r -> t` is trained as a one-hop item; a small fraction of atomic facts is "OOD":
it never appears inside a trained two-hop item. Two-hop items `h r1 r2 -> t` (through the bridge b) are trained
only when both hops are ID, either with a CoT target `b t` or with the bare answer `t`. The compositional test is
the two-hop items whose both hops are OOD. A logit lens (ln_f + lm_head on each layer's residual stream) measures
the rank of the bridge entity at the r1 and r2 positions.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

from toolkit.core.errors import BadInputError
from toolkit.study.cot_config import CotConfig

log = logging.getLogger("iclrkit")

END = "</a>"


# ----------------------------------------------------------------------------------------------- data
@dataclass
class KnowledgeBase:
    """Atomic facts `(h, r) -> t` and the two-hop splits built on them (token ids are strings here)."""

    facts: dict[tuple[int, int], int]
    ood: set[tuple[int, int]]
    train_twohop: list[tuple[int, int, int, int, int]]  # (h, r1, r2, b, t) with the trained t (noise included)
    test_iid: list[tuple[int, int, int, int, int]]
    test_ood: list[tuple[int, int, int, int, int]]
    id_atomic: list[tuple[int, int]] = field(default_factory=list)


def make_knowledge_base(config: CotConfig, seed: int) -> KnowledgeBase:
    """Random KB: each head gets `out_degree` distinct relations with random tails; a fraction is OOD."""
    rng = random.Random(seed)
    facts: dict[tuple[int, int], int] = {}
    for head in range(config.n_entities):
        for relation in rng.sample(range(config.n_relations), config.out_degree):
            facts[(head, relation)] = rng.randrange(config.n_entities)
    keys = sorted(facts)
    n_ood = max(1, round(config.ood_fraction * len(keys)))
    ood = set(rng.sample(keys, n_ood))
    by_head: dict[int, list[int]] = {}
    for head, relation in keys:
        by_head.setdefault(head, []).append(relation)
    id_twohop, ood_twohop = [], []
    for (head, r1), bridge in facts.items():
        for r2 in by_head.get(bridge, []):
            item = (head, r1, r2, bridge, facts[(bridge, r2)])
            first_ood, second_ood = (head, r1) in ood, (bridge, r2) in ood
            if not first_ood and not second_ood:
                id_twohop.append(item)
            elif first_ood and second_ood:
                ood_twohop.append(item)
    if not ood_twohop:
        raise BadInputError("the knowledge base has no two-hop item with both hops OOD",
                            "raise n_entities, out_degree or ood_fraction")
    id_twohop.sort()
    rng.shuffle(id_twohop)
    n_iid = max(1, round(config.iid_test_fraction * len(id_twohop)))
    test_iid, train_pool = id_twohop[:n_iid], id_twohop[n_iid:]
    n_train = min(len(train_pool), round(config.phi * (len(keys) - n_ood)))
    train = [_noisy(item, config, rng) for item in train_pool[:n_train]]
    id_atomic = [k for k in keys if k not in ood]
    rng.shuffle(id_atomic)
    rng.shuffle(ood_twohop)
    return KnowledgeBase(facts=facts, ood=ood, train_twohop=train, test_iid=test_iid[:config.n_test],
                         test_ood=ood_twohop[:config.n_test], id_atomic=id_atomic[:config.n_test])


def _noisy(item, config: CotConfig, rng: random.Random):
    if config.label_noise and rng.random() < config.label_noise:
        head, r1, r2, bridge, _ = item
        return (head, r1, r2, bridge, rng.randrange(config.n_entities))
    return item


@dataclass
class Vocab:
    n_entities: int
    n_relations: int

    def entity(self, i: int) -> int:
        return i

    def relation(self, j: int) -> int:
        return self.n_entities + j

    @property
    def end(self) -> int:
        return self.n_entities + self.n_relations

    @property
    def pad(self) -> int:
        return self.end + 1

    @property
    def size(self) -> int:
        return self.end + 2


def encode(kb: KnowledgeBase, vocab: Vocab, cot: bool):
    """Training sequences and the index of the first target token; the loss covers targets only."""
    sequences, starts = [], []
    for head, relation in sorted(kb.facts):
        sequences.append([vocab.entity(head), vocab.relation(relation), vocab.entity(kb.facts[(head, relation)]),
                          vocab.end])
        starts.append(2)
    for head, r1, r2, bridge, tail in kb.train_twohop:
        middle = [vocab.entity(bridge)] if cot else []
        sequences.append([vocab.entity(head), vocab.relation(r1), vocab.relation(r2), *middle,
                          vocab.entity(tail), vocab.end])
        starts.append(3)
    return sequences, starts


def to_batch(sequences, starts, vocab: Vocab):
    """Right-padded inputs and labels (-100 outside the targets) for next-token training."""
    import torch

    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), vocab.pad, dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (seq, start) in enumerate(zip(sequences, starts)):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, start:len(seq)] = torch.tensor(seq[start:])
    return ids, labels


# ----------------------------------------------------------------------------------------------- model
def build_model(config: CotConfig, vocab: Vocab):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt = GPT2Config(vocab_size=vocab.size, n_positions=8, n_embd=config.n_embd, n_layer=config.n_layer,
                     n_head=config.n_head, bos_token_id=vocab.end, eos_token_id=vocab.end, pad_token_id=vocab.pad,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(gpt)


def greedy_answers(model, prompts, steps: int):
    """Greedy continuation of equal-length prompts by `steps` tokens (no padding needed)."""
    import torch

    ids = torch.tensor(prompts, dtype=torch.long, device=model.device)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(ids).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, len(prompts[0]):]


def twohop_accuracy(model, items, vocab: Vocab, cot: bool) -> dict:
    """Final-answer accuracy (and bridge accuracy with CoT) of greedy generation on (h, r1, r2, b, t) items."""
    prompts = [[vocab.entity(h), vocab.relation(r1), vocab.relation(r2)] for h, r1, r2, _, _ in items]
    generated = greedy_answers(model, prompts, 2 if cot else 1)
    tails = [vocab.entity(t) for *_, t in items]
    answer = generated[:, -1].tolist()
    result = {"acc": sum(a == t for a, t in zip(answer, tails)) / len(items)}
    if cot:
        bridges = [vocab.entity(b) for _, _, _, b, _ in items]
        result["bridge_acc"] = sum(a == b for a, b in zip(generated[:, 0].tolist(), bridges)) / len(items)
    return result


def atomic_accuracy(model, keys, facts, vocab: Vocab) -> float:
    prompts = [[vocab.entity(h), vocab.relation(r)] for h, r in keys]
    answer = greedy_answers(model, prompts, 1)[:, 0].tolist()
    return sum(a == vocab.entity(facts[k]) for a, k in zip(answer, keys)) / len(keys)


def bridge_ranks(model, items, vocab: Vocab) -> dict[str, list[float]]:
    """Logit lens: median rank of the bridge entity per layer at the r1 (pos 1) and r2 (pos 2) positions.

    Layer 0 is the embedding output; layer L is the model's own output (HF already applies ln_f to the last
    hidden state, so it is not applied twice)."""
    import torch

    ids = torch.tensor([[vocab.entity(h), vocab.relation(r1), vocab.relation(r2)] for h, r1, r2, _, _ in items],
                       device=model.device)
    bridges = torch.tensor([vocab.entity(b) for _, _, _, b, _ in items], device=model.device)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
        ranks: dict[str, list[float]] = {"r1": [], "r2": []}
        last = len(hidden) - 1
        for layer, state in enumerate(hidden):
            normed = state if layer == last else model.transformer.ln_f(state)
            logits = model.lm_head(normed)
            for name, pos in (("r1", 1), ("r2", 2)):
                row = logits[:, pos]
                target = row.gather(1, bridges[:, None])
                rank = (row > target).sum(dim=1).float()
                ranks[name].append(float(rank.median()))
    return ranks


def first_resolved_layer(ranks: dict[str, list[float]], position: str = "r2") -> int:
    """Earliest layer at which the median bridge rank is 0 at `position` (r1, r2 or either); L+1 when never."""
    series = [ranks["r1"], ranks["r2"]] if position == "either" else [ranks[position]]
    layers = [layer for values in series for layer, rank in enumerate(values) if rank == 0]
    return min(layers) if layers else len(series[0])


# ----------------------------------------------------------------------------------------------- training
def train_one(config: CotConfig, kb: KnowledgeBase, vocab: Vocab, cot: bool, seed: int, progress,
              device: str = "cpu") -> dict:
    import torch

    from toolkit.nn.schedule import linear_warmup
    from toolkit.nn.train import fit

    torch.manual_seed(seed)
    model = build_model(config, vocab).to(device)
    ids, labels = (t.to(device) for t in to_batch(*encode(kb, vocab, cot), vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                  betas=(0.9, 0.98))
    generator = torch.Generator(device=device).manual_seed(seed)
    history = []

    def batches():
        for step in progress(range(1, config.steps + 1), config.steps, f"train {'cot' if cot else 'nocot'}"):
            yield step, torch.randint(0, ids.shape[0], (config.batch_size,), generator=generator, device=device)

    def loss_of(batch):
        step, rows = batch
        model.train()
        loss = model(ids[rows], labels=labels[rows]).loss
        if not math.isfinite(loss.item()):
            from toolkit.core.errors import RunError
            raise RunError(f"training loss became {loss.item()} at step {step}", "lower lr")
        return loss

    def after(index: int, loss, _record) -> None:
        step = index + 1
        if step % config.eval_every == 0 or step == config.steps:
            history.append({"step": step, "loss": round(loss.item(), 5), **evaluate(model, kb, vocab, cot)})
            log.info("%s step %d %s", "cot" if cot else "nocot", step, history[-1])

    fit(optimizer, batches(), loss_of, on_step=after,
        lr_at=lambda index: config.lr * linear_warmup(index, max(1, config.warmup)))
    model.eval()
    return {"model": model, "history": history, "final": history[-1],
            "ranks_iid": bridge_ranks(model, kb.test_iid, vocab),
            "ranks_ood": bridge_ranks(model, kb.test_ood, vocab)}


def evaluate(model, kb: KnowledgeBase, vocab: Vocab, cot: bool) -> dict:
    model.eval()
    iid = twohop_accuracy(model, kb.test_iid, vocab, cot)
    ood = twohop_accuracy(model, kb.test_ood, vocab, cot)
    train = twohop_accuracy(model, kb.train_twohop[:len(kb.test_iid)], vocab, cot)
    result = {"id_atomic": atomic_accuracy(model, kb.id_atomic, kb.facts, vocab),
              "ood_atomic": atomic_accuracy(model, sorted(kb.ood), kb.facts, vocab),
              "train_inferred": train["acc"], "test_inferred_iid": iid["acc"], "test_inferred_ood": ood["acc"]}
    if cot:
        result["ood_bridge_acc"] = ood["bridge_acc"]
    return result


def plot(results: dict, path_curves, path_lens) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for ax, (mode, res) in zip(axes[0], results.items()):
        steps = [h["step"] for h in res["history"]]
        for key in ("id_atomic", "train_inferred", "test_inferred_iid", "test_inferred_ood"):
            ax.plot(steps, [h[key] for h in res["history"]], label=key)
        ax.set(title=mode, xlabel="step", ylabel="accuracy", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_curves, dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for mode, res in results.items():
        for pos, style in (("r1", "--"), ("r2", "-")):
            ranks = res["ranks_iid"][pos]
            ax.plot(range(len(ranks)), ranks, style, marker="o", label=f"{mode} @ {pos}")
    ax.set(xlabel="layer (0 = embeddings)", ylabel="median rank of bridge b", yscale="symlog",
           title="logit lens on test_inferred_iid")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path_lens, dpi=120)
    plt.close(fig)


def plan(config: CotConfig, ctx) -> dict:
    """--dry-run: data sizes and parameter count without training."""
    kb = make_knowledge_base(config, ctx.seed)
    vocab = Vocab(config.n_entities, config.n_relations)
    params = sum(p.numel() for p in build_model(config, vocab).parameters())
    return {"atomic": len(kb.facts), "train_twohop": len(kb.train_twohop), "test_iid": len(kb.test_iid),
            "test_ood": len(kb.test_ood), "parameters": params, "models": config.modes,
            "sequences_seen_per_model": config.steps * config.batch_size}


def run(config: CotConfig, ctx) -> dict:
    from toolkit.core.records import write_json

    kb = make_knowledge_base(config, ctx.seed)
    vocab = Vocab(config.n_entities, config.n_relations)
    results = {}
    for mode in config.modes:
        results[mode] = train_one(config, kb, vocab, mode == "cot", ctx.seed, ctx.progress, ctx.device)
    summary = {"data": {"atomic": len(kb.facts), "ood_atomic": len(kb.ood), "train_twohop": len(kb.train_twohop),
                        "test_iid": len(kb.test_iid), "test_ood": len(kb.test_ood)}}
    for mode, res in results.items():
        final = res["final"]
        summary[mode] = {"id_acc": final["test_inferred_iid"], "ood_acc": final["test_inferred_ood"],
                         "id_atomic": final["id_atomic"], "ood_atomic": final["ood_atomic"],
                         "train_inferred": final["train_inferred"],
                         "bridge_layer": first_resolved_layer(res["ranks_iid"], config.lens_position)}
    ctx.metrics.update(summary)
    write_json(ctx.path("history.json"),
               {mode: {"history": r["history"], "ranks_iid": r["ranks_iid"], "ranks_ood": r["ranks_ood"]}
                for mode, r in results.items()})
    plot(results, ctx.path("accuracy.png"), ctx.path("logit_lens.png"))
    return summary
