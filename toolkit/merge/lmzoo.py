"""The language-model part of the merge zoo: tiny GPT-2s of two widths fine-tuned on two different texts.

One byte-level BPE tokenizer is trained on both training texts, so every model shares the vocabulary. Each zoo member
(a width and an init seed) is a backbone trained on both texts (half of every batch from each), then fine-tuned on
each text alone, with a snapshot every `snapshot_every` steps as dense checkpoints for the weight VAE. Every saved
model names its task's held-out text in its config (`iclrkit.task`), which is what the merges are scored on:
next-token top-1 accuracy (percent, the `acc_*` keys) and perplexity (`ppl_*`).
"""

from __future__ import annotations

import copy
import math
import shutil
from pathlib import Path

import torch

from toolkit.core.errors import require
from toolkit.core.records import write_json
from toolkit.merge.config import LMZooConfig, TextTask  # noqa: F401 - TextTask: the tasks' type, importable here

HELDOUT = "heldout.txt"


def _gpt2(config: LMZooConfig, width: int):
    from toolkit.zoo.recipes import gpt2_model

    return gpt2_model(vocab=config.vocab, layers=config.layers, width=width, heads=config.heads, ctx=config.context)


def mixed_batches(streams: list[torch.Tensor], config: LMZooConfig, seed: int):
    """Endless batches of `config.batch` random windows, row i drawn from stream i mod len(streams)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        rows = []
        for index in range(config.batch):
            ids = streams[index % len(streams)]
            start = int(torch.randint(0, ids.numel() - config.seqlen - 1, (1,), generator=generator))
            rows.append(ids[start:start + config.seqlen])
        yield torch.stack(rows)


def train_steps(model, streams: list[torch.Tensor], steps: int, lr: float, config: LMZooConfig, seed: int,
                on_step=None) -> float:
    """The zoo's optimisation loop (toolkit.zoo.lm.optimise: AdamW, 20 warm-up steps + cosine) on batches that draw
    equally from each token stream; `on_step(step, model)` after each step. Returns the last loss."""
    from toolkit.zoo.lm import TrainSpec, optimise

    spec = TrainSpec(steps=steps, seqlen=config.seqlen, batch=config.batch, lr=lr)
    callback = None if on_step is None else (lambda step, _loss: on_step(step, model))
    return optimise(model, mixed_batches(streams, config, seed), spec, on_step=callback)


@torch.no_grad()
def next_token_scores(model, ids: torch.Tensor, seqlen: int, max_windows: int) -> dict[str, float]:
    """Mean NLL (nats) and top-1 next-token accuracy over non-overlapping windows of `seqlen` tokens."""
    windows = [ids[i:i + seqlen] for i in range(0, ids.numel() - seqlen + 1, seqlen)][:max_windows]
    require(windows, f"held-out text has fewer than {seqlen} tokens")
    batch = torch.stack(windows)
    logits = model(batch).logits[:, :-1].float()
    targets = batch[:, 1:]
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    accuracy = (logits.argmax(-1) == targets).float().mean()
    require(bool(torch.isfinite(nll)), "the merged model produced non-finite logits")
    return {"nll": float(nll), "acc": 100.0 * float(accuracy)}


_IDS: dict[tuple[str, int], torch.Tensor] = {}


def _heldout_ids(path: str, tokenizer) -> torch.Tensor:
    """Token ids of a held-out file, tokenized once per (file, tokenizer) in this process."""
    from toolkit.data.text import read_file_text, tokenize

    key = (path, id(tokenizer))
    if key not in _IDS:
        _IDS[key] = tokenize(tokenizer, read_file_text(path))
    return _IDS[key]


def lm_task_scores(model, task_a: dict | None, task_b: dict | None) -> dict[str, float]:
    """Next-token accuracy (percent) and perplexity of a PlainModel on its parents' held-out texts; `union` is the
    two tasks equally weighted (mean accuracy, exp of the mean NLL)."""
    tasks = {k: t for k, t in (("a", task_a), ("b", task_b)) if t and t.get("heldout")}
    if not tasks:
        return {}
    net = copy.deepcopy(model.hf_model)
    net.load_state_dict(model.state, strict=False)
    net.eval()
    scores, nlls, accs = {}, [], []
    for key, task in tasks.items():
        ids = _heldout_ids(task["heldout"], model.tokenizer)
        result = next_token_scores(net, ids, task["seqlen"], task["windows"])
        scores[f"acc_task_{key}"], scores[f"ppl_task_{key}"] = result["acc"], math.exp(result["nll"])
        nlls.append(result["nll"])
        accs.append(result["acc"])
    if len(tasks) == 2:
        scores["acc_union"], scores["ppl_union"] = sum(accs) / 2, math.exp(sum(nlls) / 2)
    return scores


def _texts(config: LMZooConfig, out: Path) -> dict[str, tuple[str, Path]]:
    """Task -> (training text, held-out file written under `out`)."""
    from toolkit.data.text import load_text, split_text

    texts = {}
    for name, task in config.tasks.items():
        text = load_text(task.train)
        if task.heldout:
            train, heldout = text, load_text(task.heldout)
        else:
            train, heldout = split_text(text, 0.1, seed=0)
        path = out / f"heldout-{name}.txt"
        path.write_text(heldout[:config.heldout_chars])
        texts[name] = (train, path)
    return texts


# long: the zoo recipe (tokenizer, backbones, fine-tunes and their snapshots) with one saver closure that every
# member goes through; read top to bottom
def run_lm_zoo(config: LMZooConfig, ctx) -> None:
    from toolkit.data.text import tokenize
    from toolkit.models.save import save_model
    from toolkit.zoo.lm import train_tokenizer

    require(len(config.widths) == len(config.seeds), "widths and seeds need one entry per zoo member")
    require(len(config.tasks) >= 2, "the LM merge zoo needs at least two tasks (texts)")
    require(all(w % config.heads == 0 for w in config.widths), "every width must be a multiple of heads")
    texts = _texts(config, ctx.out)
    tokenizer = train_tokenizer("\n\n".join(train for train, _ in texts.values()), config.vocab)
    streams = {name: tokenize(tokenizer, train) for name, (train, _) in texts.items()}
    for name, ids in streams.items():
        require(ids.numel() > config.seqlen + 1, f"task {name}: training text shorter than one window")
    models, records = ctx.path("models"), []

    def save(net, name: str, task: str | None, role: str, seed: int, width: int) -> None:
        meta = {"role": role, "seed": seed, "width": width}
        if task:  # relative to the model directory, which carries its task's held-out text
            meta["task"] = {"name": task, "heldout": HELDOUT, "seqlen": config.seqlen, "windows": config.score_windows}
        save_model(net, tokenizer, models / name, technique="merge.lm-zoo", source="in-process GPT-2 config",
                   metadata=meta)
        if task:
            shutil.copyfile(texts[task][1], models / name / HELDOUT)
        record = {"name": name, "role": role, "width": width}
        for other, (_, heldout) in texts.items():
            ids = _heldout_ids(str(heldout.resolve()), tokenizer)
            result = next_token_scores(net, ids, config.seqlen, config.score_windows)
            record[f"acc_{other}"], record[f"ppl_{other}"] = result["acc"], math.exp(result["nll"])
        records.append(record)

    for width, seed in ctx.progress(list(zip(config.widths, config.seeds)), total=len(config.widths),
                                    description="GPT-2 zoo"):
        torch.manual_seed(seed)
        backbone = _gpt2(config, width)
        train_steps(backbone, list(streams.values()), config.backbone_steps, config.lr, config, seed)
        stem = f"g{width}-s{seed}"
        save(backbone, f"{stem}-backbone", None, "backbone", seed, width)
        for task in config.tasks:
            fine = copy.deepcopy(backbone)

            def snapshot(step, net, task=task):
                if step % config.snapshot_every == 0 and step < config.finetune_steps:
                    save(net.eval(), f"{stem}-{task}-step{step}", task, "snapshot", seed, width)
                    net.train()

            train_steps(fine, [streams[task]], config.finetune_steps, config.finetune_lr, config, seed + 1000,
                        on_step=snapshot)
            save(fine, f"{stem}-{task}", task, "final", seed, width)
    write_json(ctx.path("zoo.json"), records)
    ctx.metrics["n_models"] = len(records)
    ctx.metrics["models"] = {r["name"]: {k: v for k, v in r.items() if k.startswith(("acc_", "ppl_"))}
                             for r in records if r["role"] != "snapshot"}
