"""Served-model checks of a repro-obr setting: llama.cpp agreement, compressed-tensors reload, zero-shot accuracy.

Benchmark script, not a test. For OUT/<model>/<setting>/<method>/ runs that hold a packed/ model (obr-gptq first),
and the dense model of OUT/<model>/dense for reference:
  1. llama.cpp: export packed/ to GGUF Q4_0, greedy-decode 5 prompts with llama.cpp and with the in-memory model
     (examples/obr/llamacpp_check.py: check_run); `llamacpp_agreement` = leading tokens llama.cpp agrees on
     before the first difference, summed over the prompts / (prompts x new tokens).
  2. compressed-tensors: export, `AutoModelForCausalLM.from_pretrained`, `ct_reload_max_abs_diff` = max |logit
     difference| against the in-memory model over every position of the 5 prompts.
  3. zero-shot: `iclrkit eval tasks` (lm-eval) on the local tasks of examples/lmeval/tasks (default iclrkit_sst2,
     iclrkit_counterfact; the data root's sst2/dev.tsv and counterfact sample), first --limit documents per task;
     columns `<task>_acc` and `<task>_acc_stderr` (task name without its `iclrkit_` prefix).
Writes OUT/serve_check.json ({"rows": [{model, setting, method, llamacpp_agreement, ct_reload_max_abs_diff,
sst2_acc, sst2_acc_stderr, ...}], "details": {...}}) after every row; rows already there (without an error) with the
same limit, tasks and new tokens are kept (--fresh recomputes). examples/obr/collect.py merges the rows into results.json.
Nothing else is written under OUT (exports and lm-eval outputs go to --work, a temporary folder by default).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python examples/obr/serve_check.py              # runs/repro-obr
    .venv/bin/python examples/obr/serve_check.py --out runs/repro-obr --setting smollm2-135m/w4a16-s50 --limit 300
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import collect  # noqa: E402 - examples/obr/collect.py: the row keys results.json uses
import llamacpp_check  # noqa: E402 - examples/obr/llamacpp_check.py

FIRST = "obr-gptq"
DEFAULT_TASKS = "iclrkit_sst2,iclrkit_counterfact"


def _log(message: str, started: float) -> None:
    print(f"[serve-check {time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)


def compressed_runs(setting_dir: Path) -> list[Path]:
    """Method directories of a setting that hold a finished run with a packed/ model, obr-gptq first, then in
    collect.py's method order."""
    order = list(collect.METHODS)
    found = [d for d in setting_dir.iterdir()
             if d.is_dir() and (d / "run.json").is_file() and (d / "packed" / "model.packed.safetensors").is_file()]
    return sorted(found, key=lambda d: (d.name != FIRST, order.index(d.name) if d.name in order else 99, d.name))


def dense_model(model_dir: Path) -> str | None:
    """The model the dense row evaluated (its eval ppl run.json), or None."""
    record = model_dir / "dense" / "run.json"
    if not record.is_file():
        return None
    config = json.loads(record.read_text()).get("config", {})
    return config.get("model")


def task_columns(metrics: dict) -> dict:
    """{'sst2_acc': ..., 'sst2_acc_stderr': ..., ...} from an `iclrkit eval tasks` run.json's metrics."""
    columns = {}
    for task, scores in sorted(metrics.get("tasks", {}).items()):
        short = task.removeprefix("iclrkit_")
        for metric in ("acc", "acc_stderr"):
            if metric in scores:
                columns[f"{short}_{metric}"] = scores[metric]
        columns[f"{short}_n"] = metrics.get("n_samples", {}).get(task)
    return columns


def zero_shot(model: str, args, work: Path) -> dict:
    """`iclrkit eval tasks` in a subprocess (one clean process per model); its run.json metrics as columns."""
    out = work / "tasks"
    command = [str(ROOT / ".venv" / "bin" / "iclrkit"), "-q", "--offline", "--threads", str(args.threads), "eval",
               "tasks", "--model", model, "--tasks", args.tasks, "--include-path", str(args.include_path),
               "--data-root", str(args.data_root), "--limit", str(args.limit), "--out", str(out), "--overwrite",
               "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = round(time.perf_counter() - started, 1)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return {"tasks_error": f"exit {done.returncode}: {lines[-1] if lines else '?'}", "tasks_seconds": seconds}
    metrics = json.loads((out / "run.json").read_text())["metrics"]
    return {**task_columns(metrics), "tasks_seconds": seconds, "quant_setting": metrics.get("quant_setting")}


def serve_columns(run_dir: Path, args, work: Path, started: float) -> tuple[dict, dict]:
    """(row columns, full llama.cpp report) of one compressed run."""
    from toolkit.core.errors import IclrkitError

    try:
        report = llamacpp_check.check_run(run_dir, work, args.new_tokens, args.python, args.threads, True, started)
    except (RuntimeError, IclrkitError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        return {"llamacpp_agreement": None, "ct_reload_max_abs_diff": None, "serve_error": message}, {}
    ct = report["compressed_tensors_reload"]
    columns = {"llamacpp_agreement": report["token_agreement_vs_in_memory"],
               "llamacpp_agreement_vs_fp16_scales": report["token_agreement_vs_fp16_scales"],
               "llamacpp_exact_prompts": report["exact_prompts_vs_in_memory"],
               "ct_reload_max_abs_diff": ct.get("max_abs_logit_diff"),
               "ct_reload_max_rel_diff": ct.get("max_relative_logit_diff"),
               "gguf_mb": report["gguf_mb"]}
    if "skipped" in ct:
        columns["ct_reload_skipped"] = ct["skipped"]
    details = {k: v for k, v in report.items() if k not in ("packed", "gguf")}
    return columns, details


def _write(path: Path, payload: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2) + "\n")
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/repro-obr", help="the repro output folder (default runs/repro-obr)")
    parser.add_argument("--setting", default="smollm2-135m/w4a16-s50", help="MODEL/SETTING folder under --out")
    parser.add_argument("--methods", help="comma-separated method folders (default: every one with a packed/)")
    parser.add_argument("--tasks", default=DEFAULT_TASKS)
    parser.add_argument("--limit", type=int, default=300, help="documents per task (default 300)")
    parser.add_argument("--include-path", default=str(ROOT / "examples" / "lmeval" / "tasks"))
    parser.add_argument("--data-root", default=os.environ.get("ICLRKIT_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--python", default=llamacpp_check.DEFAULT_PYTHON, help="interpreter with llama-cpp-python")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense reference row")
    parser.add_argument("--work", help="keep exports and lm-eval outputs here (default: a temporary folder)")
    parser.add_argument("--fresh", action="store_true", help="recompute rows already in serve_check.json")
    args = parser.parse_args()

    out = Path(args.out)
    model_name, _, setting_name = args.setting.partition("/")
    setting_dir = out / model_name / setting_name
    if not setting_name or not setting_dir.is_dir():
        print(f"error: {setting_dir} is not a folder (--setting MODEL/SETTING under --out)", file=sys.stderr)
        sys.exit(2)
    if args.limit <= 0 or args.new_tokens <= 0 or args.threads <= 0:
        print("error: --limit, --new-tokens and --threads must be positive", file=sys.stderr)
        sys.exit(2)
    runs = compressed_runs(setting_dir)
    if args.methods:
        wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
        runs = [d for d in runs if d.name in wanted]
    if not runs:
        print(f"error: no finished run with a packed/ model under {setting_dir}", file=sys.stderr)
        sys.exit(2)
    dense = None if args.no_dense else dense_model(out / model_name)

    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    target = out / collect.SERVE_CHECK
    protocol = {"tasks": args.tasks, "limit": args.limit, "new_tokens": args.new_tokens}
    payload = {"protocol": {**protocol, "threads": args.threads, "prompts": llamacpp_check.PROMPTS,
                            "llamacpp_agreement": "leading greedy tokens llama.cpp agrees on before the first "
                                                  "difference / (prompts x new_tokens), vs the in-memory model",
                            "ct_reload_max_abs_diff": "max |logit difference|, compressed-tensors reload "
                                                      "(from_pretrained) vs the in-memory model, every position"},
               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "rows": [], "details": {}}
    previous = {}
    if target.is_file() and not args.fresh:
        old = json.loads(target.read_text())
        if {k: old.get("protocol", {}).get(k) for k in protocol} == protocol:
            previous = {tuple(r[k] for k in collect.KEY): r for r in old.get("rows", [])
                        if not any(key.endswith("_error") for key in r)}  # failed rows are retried
            payload["details"] = old.get("details", {})
    work_root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="iclrkit-serve-check-"))
    entries = [(d, d.relative_to(out).parts) for d in runs[:1]]
    if dense is not None:
        entries.append((None, (model_name, "dense")))
    entries += [(d, d.relative_to(out).parts) for d in runs[1:]]
    try:
        for run_dir, parts in entries:
            model, setting, method = collect.row_key(parts)
            key = (model, setting, method)
            if key in previous:
                payload["rows"].append(previous[key])
                _log(f"{method}: kept from {target}", started)
                continue
            work = work_root / parts[-1]
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            row = {"model": model, "setting": setting, "method": method}
            if run_dir is None:
                row.update({"llamacpp_agreement": None, "ct_reload_max_abs_diff": None, "source_model": dense})
                _log(f"{method}: zero-shot on {dense}", started)
                row.update(zero_shot(dense, args, work))
            else:
                _log(f"{method}: llama.cpp + compressed-tensors checks", started)
                t0 = time.perf_counter()
                columns, details = serve_columns(run_dir, args, work, started)
                row.update(columns, serve_seconds=round(time.perf_counter() - t0, 1))
                payload["details"][method] = details
                _log(f"{method}: zero-shot", started)
                row.update(zero_shot(str(run_dir / "packed"), args, work))
            payload["rows"].append(row)
            _write(target, payload)
            _log(f"{method}: {json.dumps({k: v for k, v in row.items() if k not in collect.KEY})}", started)
    finally:
        if not args.work:
            shutil.rmtree(work_root, ignore_errors=True)
    _write(target, payload)
    print(json.dumps(payload["rows"], indent=2))


if __name__ == "__main__":
    main()
