"""`iclrkit eval tasks`: lm-evaluation-harness through its Python API, on the model as iclrkit runs it.

A `packed/` model is loaded by `toolkit.models.source.load_model` with its run's activation / KV-cache fake
quantization installed (toolkit.export.quantized.load_packed_model), so zero-shot numbers are measured in the same
setting as the run's perplexity; any other model is evaluated as it loads. Local task YAMLs (`--include-path`) over
local files work offline; their `custom_dataset` functions receive `data_root` (--data-root, else $ICLRKIT_DATA).
Tasks are built (and their data read) before the model is loaded: a task that needs the network while offline is
one line and exit 3, and nothing is written.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.eval.config import TasksConfig

log = logging.getLogger("iclrkit")

NETWORK_ERRORS = ("ConnectionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectTimeout",
                  "MaxRetryError", "NameResolutionError")


def _offline() -> bool:
    from toolkit.models.source import offline

    return offline() or os.environ.get("HF_DATASETS_OFFLINE", "0") not in ("0", "", "false")


def _is_network(exc: BaseException) -> bool:
    seen = exc
    while seen is not None:
        if any(name in type(seen).__name__ for name in NETWORK_ERRORS) or "offline" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def load_tasks(config: TasksConfig):
    """(task dict, names) or one BadInputError / ResourceError line."""
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise ResourceError("lm-evaluation-harness is not installed", "pip install lm-eval") from None
    names = [name.strip() for name in config.tasks.split(",") if name.strip()]
    if not names:
        raise BadInputError("--tasks is empty")
    include = None
    if config.include_path:
        include = Path(config.include_path).expanduser()
        if not include.is_dir():
            raise BadInputError(f"--include-path {config.include_path} is not a directory")
        include = str(include.resolve())
    data_root = config.data_root or os.environ.get("ICLRKIT_DATA")
    metadata = {"data_root": str(Path(data_root).expanduser().resolve())} if data_root else {}
    # indexing lm-eval's ~15k built-in task YAMLs takes ~20 s on a small CPU: only when a name is not local
    manager = TaskManager(include_path=include, include_defaults=False, metadata=metadata) if include else None
    if manager is None or any(name not in manager.all_tasks for name in names):
        manager = TaskManager(include_path=include, metadata=metadata)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise BadInputError(f"unknown lm-eval task(s): {', '.join(unknown)}",
                            "pass --include-path DIR for local task YAMLs" if include is None else
                            f"not found in {include} nor among lm-eval's built-in tasks")
    try:
        return get_task_dict(names, manager), names
    except Exception as exc:  # noqa: BLE001 - dataset loaders raise anything; map to one line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if _is_network(exc):
            where = "while offline (HF_HUB_OFFLINE / --offline)" if _offline() else "and it is unreachable"
            raise ResourceError(f"task {', '.join(names)} needs the network to fetch its data {where}: {first}",
                                "use a local task YAML over local files (--include-path)") from None
        if isinstance(exc, (FileNotFoundError, KeyError, ValueError)) or type(exc).__name__ == "DatasetNotFoundError":
            raise BadInputError(f"task {', '.join(names)} could not be built: {type(exc).__name__}: {first}") from None
        raise


def _scores(results: dict) -> dict:
    """{task: {metric: value}} with lm-eval's 'acc,none' keys as 'acc' (other filters keep their suffix)."""
    table = {}
    for task, values in results.get("results", {}).items():
        row = {}
        for key, value in values.items():
            if key in ("alias", "sample_len", "samples") or not isinstance(value, (int, float)):
                continue
            metric, _, filt = key.partition(",")
            row[metric if filt in ("none", "") else f"{metric}[{filt}]"] = round(float(value), 6)
        table[task] = row
    return table


def run_tasks(config: TasksConfig, ctx) -> dict:
    from toolkit.models.source import load_model

    task_dict, names = load_tasks(config)  # before the model: a task that cannot be built costs nothing
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    ctx.inputs["model"] = config.model
    packed = getattr(model, "iclrkit_packed", None)
    hooks = hasattr(model, "iclrkit_quant_hooks")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=config.batch_size, max_length=config.max_length,
              device=ctx.device)
    if config.num_fewshot is not None:
        for task in _leaves(task_dict):
            task.set_config(key="num_fewshot", value=config.num_fewshot)
    results = evaluate(lm=lm, task_dict=task_dict, limit=config.limit, bootstrap_iters=config.bootstrap_iters,
                       log_samples=False, verbosity="WARNING")
    scores = _scores(results or {})
    if ctx.out is not None:
        ctx.path("lm_eval_results.json").write_text(json.dumps(results, indent=2, default=str))
    ctx.metrics.update({"tasks": scores, "n_samples": {k: v.get("effective", v.get("original"))
                                                       for k, v in (results or {}).get("n-samples", {}).items()},
                        "quant_setting": (f"packed W{packed.get('w_bits')}A{packed.get('a_bits')}"
                                          f"KV{packed.get('kv_bits')}"
                                          + (" (activation/KV fake-quant hooks on)" if hooks else ""))
                        if packed else "as loaded (no packed quantization)"})
    return ctx.metrics


def _leaves(task_dict) -> list:
    from lm_eval.api.task import Task

    leaves = []
    for value in task_dict.values():
        if isinstance(value, Task):
            leaves.append(value)
        elif isinstance(value, dict):
            leaves.extend(_leaves(value))
    return leaves
