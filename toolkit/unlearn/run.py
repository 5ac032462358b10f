"""run() of every `iclrkit unlearn OBJECTIVE`: the registered objective (toolkit/unlearn/objectives/) picked by
`config.method`, on the one shared path: load -> windows -> objective's setup -> training loop -> save + metrics.

An objective is registered as `build(config, ctx, model, corpus) -> (step, params, extra)`
(toolkit.unlearn.train.UnlearnMethod): `step` is called at every step with a StepInputs and leaves the gradients
in p.grad (toolkit.unlearn.train.Objective), `params` are the tensors AdamW updates, `extra` goes into the
metrics. Registration metadata: `needs_retain` (bool, or a function of
the config), `help`, `epilog` and `flags` (the command line), `plan` (a torch-free function(config, ctx) -> dict for --dry-run), `paper`.
"""

from __future__ import annotations

import time

from toolkit.core.errors import BadInputError
from toolkit.core.registry import Entry, registry
from toolkit.models.source import load_model
from toolkit.unlearn.config import UnlearnConfig
from toolkit.unlearn.train import load_corpus, train


def objective_for(config: UnlearnConfig) -> Entry:
    """The registered objective `config.method` names; its config class must be the one `config` is."""
    if not config.method:
        raise BadInputError(f"{type(config).__name__} names no unlearning objective",
                            f"set method to one of: {', '.join(registry('unlearn').names())}")
    entry = registry("unlearn").get(config.method)
    if entry.config is not None and not isinstance(config, entry.config):
        raise BadInputError(f"objective '{entry.name}' takes a {entry.config.__name__}, got {type(config).__name__}",
                            f"run `iclrkit unlearn {entry.name}`")
    return entry


def needs_retain(entry: Entry, config: UnlearnConfig) -> bool:
    need = entry.meta.get("needs_retain", True)
    return bool(need(config) if callable(need) else need)


def run_unlearn(config: UnlearnConfig, ctx) -> None:
    entry = objective_for(config)
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    corpus = load_corpus(config, tokenizer, need_retain=needs_retain(entry, config))
    clock = time.perf_counter()
    objective, params, extra = entry.obj(config, ctx, model, corpus)
    result = train(config, ctx, model, corpus, objective, params, entry.name)
    finish(ctx, config, tokenizer, result, f"unlearn.{entry.name}",
           {**extra, "forget_windows": len(corpus.forget), "retain_windows": len(corpus.retain),
            "seconds": time.perf_counter() - clock}, paper=entry.meta.get("paper", ""))


def plan_unlearn(config: UnlearnConfig, ctx) -> dict:
    """--dry-run: the objective's own plan when it registered one."""
    import torch

    from toolkit.models.memory import whole_model_plan

    entry = objective_for(config)
    plan = entry.meta.get("plan")
    details = ({"objective": entry.name, "epochs": config.epochs, "max_steps": config.max_steps} if plan is None
               else plan(config, ctx))
    return {**details, "memory": whole_model_plan(
        config.model, "unlearning trains the whole model (every block in each backward pass); it is loaded whole, "
        "with gradients and AdamW state", compute_dtype=ctx.torch_dtype or torch.float32)}


def finish(ctx, config: UnlearnConfig, tokenizer, result: dict, technique: str, extra: dict, paper: str = "") -> None:
    """Save the unlearned model and record the training metrics."""
    from toolkit.models.save import save_model

    history = result["history"]
    last = history[-1] if history else {}
    ctx.metrics.update({"steps": result["steps"], "steps_per_epoch": result["steps_per_epoch"],
                        "resumed_from": result["resumed_from"], **extra,
                        **{f"final_{k}": v for k, v in last.items() if k != "step"}})
    ctx.metrics["loss_history"] = history
    if ctx.out is not None:
        save_model(result["model"], tokenizer, ctx.path("model"), technique=technique, source=config.model,
                   paper=paper, metadata={"technique": technique})
