"""Scale benchmark (issue 25): random-weight Llama models of real shapes, compressed with per-block onloading.

    python examples/scale/bench.py [--shapes 135M,360M,1.1B] [--methods gptq,obr] [--work DIR] [--skip-merge]

Models are written once as sharded bf16 safetensors from a fixed seed (time and disk recorded). Each compress runs
in its own process (`compress gptq|obr`, W4A16 + 50 % sparsity, 8 x 512 calibration tokens, onload=true) so its
peak RSS (getrusage ru_maxrss) is its own; the plan is toolkit.models.memory.plan_memory from config.json plus the
RSS the process had before its first tensor. The 7B shape gets its --dry-run plan and one measured block (a
1-block model of the Llama-2-7B shape: the per-block cost does not depend on depth). The 3-way merge streams
three 1.1B-shape models. Weights are random: quality is not measured, cost is.

Rows go to examples/scale/results.json; RESULTS.md is written from them. Only measured figures are written.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from toolkit.models.synthetic import dir_bytes, llama_config, write_random_model

HERE = Path(__file__).resolve().parent
MB = 2**20

NSAMPLES, SEQLEN = 8, 512


def rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- subprocesses: one measurement each, its own peak RSS ------------------------------------------------------------

def _import_runtime() -> None:
    """Import what the run will import (torch, transformers' Llama, tokenizers), so the baseline RSS holds it."""
    import torch  # noqa: F401
    from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: F401

    import toolkit.compress.obr  # noqa: F401
    import toolkit.compress.solvers  # noqa: F401


def child_compress(model: str, method: str, out: str, threads: str = "0") -> dict:
    _import_runtime()
    import torch

    if int(threads) > 0:  # the benchmark's own process policy (the CLI's --threads does the same in the runner)
        torch.set_num_threads(int(threads))

    from toolkit.compress.config import GptqConfig
    from toolkit.compress.obr import ObrConfig
    from toolkit.compress.recipe import run_compress
    from toolkit.core.context import RunContext
    from toolkit.models.memory import plan_memory

    baseline = rss_bytes()
    cls = GptqConfig if method == "gptq" else ObrConfig
    config = cls(model=model, data="embedded", nsamples=NSAMPLES, seqlen=SEQLEN, w_bits=4, a_bits=16, kv_bits=16,
                 sparsity=0.5, rotate=False, export="dense", onload=True)
    from toolkit.models.memory import block_dims, skeleton
    from toolkit.models.view import view_of

    meta = skeleton(model)  # the run's own choice of a batched (fused) calibration forward, from config.json
    batched = config.fused_calibration_fits(NSAMPLES, SEQLEN, block_dims(view_of(meta)))
    plan = plan_memory(model, nsamples=NSAMPLES, seqlen=SEQLEN, runtime_bytes=baseline, batched=batched)
    ctx = RunContext(out=Path(out), quiet=True)
    solves = record_obr_solves() if method == "obr" else None
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        run_compress(config, ctx)
    finally:
        if solves is not None:
            solves.restore()
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    per_block = ctx.metrics["seconds_per_block"]
    return {"seconds": round(seconds, 1), "seconds_per_block": per_block, "cpu_seconds": round(cpu_seconds, 1),
            "cpu_seconds_per_block": [round(t, 2) for t in ctx.metrics["cpu_seconds_per_block"]], "peak_rss_mb": round(peak_rss_bytes() / MB),
            "baseline_rss_mb": round(baseline / MB), "planned_mb": round(plan["peak_bytes"]["cpu"] / MB),
            "plan": plan["mb"], "sparsity": ctx.metrics["sparsity"], "blocks": plan["blocks"],
            "parameters": plan["parameters"],
            "output_mb": round(dir_bytes(Path(out) / "model") / MB, 1), "threads": torch.get_num_threads(),
            "calibration": ctx.metrics.get("calibration"),
            "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            **({"solver_per_block": solves.per_block(len(per_block))} if solves is not None else {})}


class record_obr_solves:  # noqa: N801 - used like a function
    """Wraps toolkit.compress.obr.obr_quantize for one run: every linear's restoration SolveStats, in call order
    (the pipeline compresses the blocks one after another, each block's linears together)."""

    def __init__(self):
        import toolkit.compress.obr as module

        self.module, self.original, self.linears = module, module.obr_quantize, []

        def recorded(*args, **kwargs):
            stats: list = []
            result = self.original(*args, stats=stats, **kwargs)
            self.linears.append(stats)
            return result

        module.obr_quantize = recorded

    def restore(self) -> None:
        self.module.obr_quantize = self.original

    def per_block(self, blocks: int) -> list[dict]:
        """Per block: CG iterations (pruning solve, quantization solve, summed over the linears), CPU seconds of
        the restoration, in the products with H, the preconditioner and its set-up, the largest relative residual
        and estimated loss excess at the stop."""
        if not blocks or len(self.linears) % blocks:
            return []
        size = len(self.linears) // blocks
        out = []
        for b in range(blocks):
            group = self.linears[b * size:(b + 1) * size]
            solves = [s for stats in group for s in stats]
            out.append({"iterations": [sum(stats[0].iterations for stats in group if stats),
                                       sum(stats[1].iterations for stats in group if len(stats) > 1)],
                        "restoration_s": round(sum(s.seconds for s in solves), 3),
                        "product_s": round(sum(s.product_seconds for s in solves), 3),
                        "preconditioner_s": round(sum(s.preconditioner_seconds for s in solves), 3),
                        "setup_s": round(sum(s.setup_seconds for s in solves), 3),
                        "max_residual": max((s.residual for s in solves), default=None),
                        "max_excess": max((s.excess for s in solves if s.excess is not None), default=None)})
        return out


def child_merge(models: str, out: str) -> dict:
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401

    from toolkit.core.context import RunContext
    from toolkit.merge.weightspace import AverageConfig, run_weightspace

    baseline = rss_bytes()
    ctx = RunContext(out=Path(out), quiet=True)
    started = time.perf_counter()
    run_weightspace(AverageConfig(models=models.split(",")), ctx)
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_mb": round(peak_rss_bytes() / MB),
            "baseline_rss_mb": round(baseline / MB), "streamed": ctx.metrics.get("streamed"),
            "output_mb": round(dir_bytes(Path(out) / "model") / MB, 1)}


def commit() -> str:
    """The working tree's commit (+ "-dirty" when its code differs from it): every row carries it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "toolkit", "cli", "examples/scale/bench.py"],
                               cwd=HERE.parents[1]).returncode != 0  # code only: results.json changes as rows land
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_child(*args: str) -> dict:
    niceness = os.nice(0)  # children run at niceness 10 (not 10 on top of an already niced driver)
    prefix = ["nice", "-n", str(10 - niceness)] if niceness < 10 else []
    command = [*prefix, sys.executable, str(Path(__file__).resolve()), *args]
    # the CLI's allocator policy (cli/_runner.apply_allocator): the children call the library, not the CLI
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_",
                                                                                       str(1 << 20))}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"child failed ({' '.join(args)}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- the driver --------------------------------------------------------------------------------------------------

def save_rows(rows: list[dict], extra: dict) -> None:
    """Merge this driver's rows (and models) into results.json as it is now: several drivers may run at once."""
    path = HERE / "results.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    merged = list(previous.get("rows", []))
    before = previous.setdefault("rows_before", [])
    for row in rows:  # a row of another commit that this one replaces is kept under rows_before (notes cite it)
        replaced = [r for r in merged if key(r) == key(row) and r.get("commit") != row.get("commit")]
        before += [r for r in replaced if r not in before]
        upsert(merged, row)
    for name, value in extra.items():
        previous[name] = {**previous.get(name, {}), **value} if isinstance(value, dict) else value
    previous["rows"] = merged
    if not before:
        previous.pop("rows_before")
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps(previous, indent=2))
    temporary.replace(path)
    write_markdown(previous)


def key(r: dict) -> tuple:
    """What a row measures: a later row with the same key replaces it in the table."""
    return r["shape"], r["method"], r.get("threads")


def upsert(rows: list[dict], row: dict) -> None:
    rows[:] = [r for r in rows if key(r) != key(row)] + [row]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="135M,360M,1.1B")
    parser.add_argument("--methods", default="gptq,obr")
    parser.add_argument("--work", default=str(HERE.parents[1] / "runs" / "scale"))
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--skip-7b", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the compressed outputs")
    parser.add_argument("--note", default="2 cores shared with other jobs; runs under nice -n 10",
                        help="how loaded the machine was (goes into RESULTS.md)")
    parser.add_argument("--layers", type=int, default=0,
                        help="write the shapes with this many decoder blocks only (per-block cost of a shape whose "
                             "full depth the CPU cannot afford); rows are labelled '<shape> (<n> blocks)'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each compress (0: torch's default)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    extra = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").is_file() else {}
    written = extra.get("models_written", {})
    machine = {"cpus": os.cpu_count(), "note": args.note}
    tokenizer = None

    def ensure(shape: str, name: str | None = None, seed: int = 0, layers: int | None = None) -> Path:
        nonlocal tokenizer
        path = work / (name or shape)
        if (path / "config.json").is_file():
            return path
        if tokenizer is None:
            from toolkit.data.text import embedded_text
            from toolkit.zoo.lm import train_tokenizer

            tokenizer = train_tokenizer(embedded_text()[:400_000], vocab_size=2000)
        info = write_random_model(path, llama_config(shape, layers), seed, tokenizer)
        written[name or shape] = info
        print(f"wrote {name or shape}: {info}", flush=True)
        save_rows(rows, {"models_written": written, "machine": machine})
        return path

    for shape in [s for s in args.shapes.split(",") if s]:
        name = f"{shape}-{args.layers}block" if args.layers else shape
        model = ensure(shape, name=name, layers=args.layers or None)
        label = f"{shape} ({args.layers} blocks)" if args.layers else shape
        for method in [m for m in args.methods.split(",") if m]:
            out = work / f"out-{name}-{method}"
            shutil.rmtree(out, ignore_errors=True)
            result = run_child("_compress", str(model), method, str(out), str(args.threads))
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
            row = {"shape": label, "method": method,
                   "params": written.get(name, {}).get("parameters") or result.pop("parameters", None), **result,
                   "commit": commit(), "command": " ".join(["python", "examples/scale/bench.py", *sys.argv[1:]]),
                   "note": args.note, "date": time.strftime("%Y-%m-%d", time.gmtime()),
                   "machine": {"cores": os.cpu_count(), "note": args.note}, "repro": "examples/scale/bench.py",
                   "seed": 0}  # the provenance every results row carries (scripts/provenance.py)
            row.pop("parameters", None)
            per_block = result["seconds_per_block"]
            row["seconds_per_block_mean"] = round(sum(per_block) / len(per_block), 2)
            cpu_blocks = result["cpu_seconds_per_block"]
            row["cpu_seconds_per_block_mean"] = round(sum(cpu_blocks) / len(cpu_blocks), 2)
            row["seconds_per_block"] = [round(t, 2) for t in per_block]
            upsert(rows, row)
            save_rows(rows, {"models_written": written, "machine": machine})
            print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)

    if not args.skip_7b:
        import torch

        from toolkit.models.memory import plan_memory

        full = plan_memory(llama_config("7B"), nsamples=NSAMPLES, seqlen=SEQLEN)
        h200 = plan_memory(llama_config("7B"), nsamples=128, seqlen=4096, device="cuda", compute_dtype=torch.bfloat16,
                           save_dtype=torch.bfloat16)
        model = ensure("7B", name="7B-1block", layers=1)
        out = work / "out-7B"
        shutil.rmtree(out, ignore_errors=True)
        result = run_child("_compress", str(model), "gptq", str(out))
        shutil.rmtree(out, ignore_errors=True)
        row = {"shape": "7B", "method": "gptq", "note": "1-block model of the Llama-2-7B shape (its block measured); plan for 32 blocks",
               "params": full["parameters"], "planned_mb": round(full["peak_bytes"]["cpu"] / MB),
               "plan": full["mb"], "plan_h200_128x4096_bf16_mb": h200["peak_mb"],
               "seconds_per_block": [round(t, 2) for t in result["seconds_per_block"]],
               "seconds_per_block_mean": round(result["seconds_per_block"][0], 2),
               "peak_rss_mb": result["peak_rss_mb"], "baseline_rss_mb": result["baseline_rss_mb"],
               "measured_1block_planned_mb": result["planned_mb"], "seconds": None}
        upsert(rows, row)
        save_rows(rows, {"models_written": written, "machine": machine})
        print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)

    if not args.skip_merge:
        parents = [ensure("1.1B", name=f"1.1B-merge{i}", seed=10 + i) for i in range(3)]
        out = work / "out-merge"
        shutil.rmtree(out, ignore_errors=True)
        result = run_child("_merge", ",".join(map(str, parents)), str(out))
        shutil.rmtree(out, ignore_errors=True)
        row = {"shape": "1.1B", "method": "merge-average-3way", "params": written.get("1.1B-merge0", {}).get(
            "parameters"), "planned_mb": None, "seconds_per_block": None, **result}
        upsert(rows, row)
        save_rows(rows, {"models_written": written, "machine": machine})
        print(json.dumps(row), flush=True)


def fit_lines(rows: list[dict]) -> list[str]:
    """Per method: the exponent b of CPU seconds ∝ parameters^b (least squares on logs) over the full-depth shapes
    measured with one thread, and the spread of the CPU seconds per block across depth."""
    import math

    lines = []
    for method in sorted({r["method"] for r in rows}):
        points = [(r["params"], r["cpu_seconds"]) for r in rows if r["method"] == method and r.get("cpu_seconds")
                  and r.get("params") and "blocks)" not in r["shape"] and r.get("threads") == 1]
        if len(points) < 2:
            continue
        xs, ys = [math.log(p) for p, _ in points], [math.log(t) for _, t in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        lines.append(f"- {method}: CPU seconds ∝ parameters^{slope:.2f} over {len(points)} shapes "
                     f"({', '.join(f'{p / 1e6:.0f}M: {t:.0f} s' for p, t in sorted(points))}).")
    lines += per_block_fit_lines(rows)
    for r in rows:
        blocks = r.get("cpu_seconds_per_block") or []
        if len(blocks) >= 4:
            half = len(blocks) // 2
            first, second = sum(blocks[:half]) / half, sum(blocks[half:]) / (len(blocks) - half)
            lines.append(f"- {r['shape']} {r['method']}: CPU s/block first half {first:.2f}, second half "
                         f"{second:.2f} (min {min(blocks):.2f}, max {max(blocks):.2f}).")
    return lines


def block_parameters(shape: str) -> int:
    """Weights of one decoder block's linears of a synthetic shape ("1.1B (2 blocks)" reads as "1.1B")."""
    from toolkit.models.synthetic import SHAPES

    c = SHAPES[shape.split(" ")[0]]
    h, i, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads) * (h // heads)
    return 2 * h * h + 2 * h * kv + 3 * h * i


def per_block_fit_lines(rows: list[dict]) -> list[str]:
    """Per method: b in CPU s per block ∝ (block parameters)^b over the shapes measured with one thread at the same
    commit as the newest row of that method (full-depth or `--layers` rows: the per-block cost does not depend on
    depth), and the OBR/GPTQ gap in exponents."""
    import math

    fits = {}
    for method in ("gptq", "obr"):
        mine = [r for r in rows if r["method"] == method and r.get("threads") == 1 and r.get("commit")
                and r.get("cpu_seconds_per_block_mean") and r["shape"].split(" ")[0] in ("135M", "360M", "1.1B")]
        if not mine:
            continue
        newest = mine[-1]["commit"]
        points = {}
        for r in mine:
            if r["commit"] == newest:
                points[r["shape"].split(" ")[0]] = (block_parameters(r["shape"]), r["cpu_seconds_per_block_mean"])
        if len(points) < 2:
            continue
        xs = [math.log(p) for p, _ in points.values()]
        ys = [math.log(t) for _, t in points.values()]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        fits[method] = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs),
                        newest, points)
    lines = []
    for method, (slope, commit, points) in fits.items():
        lines.append(f"- {method} (at {commit}): CPU s per block ∝ block parameters^{slope:.2f} over "
                     f"{len(points)} shapes ({', '.join(f'{k}: {p / 1e6:.1f}M, {t:.2f} s' for k, (p, t) in points.items())}).")
    if len(fits) == 2:
        lines.append(f"- OBR's per-block exponent minus GPTQ's: {fits['obr'][0] - fits['gptq'][0]:+.2f}.")
    return lines


def cpu_span(row: dict) -> str:
    blocks = row.get("cpu_seconds_per_block") or []
    return f"{blocks[0]}→{blocks[-1]}" if blocks else "-"


def write_markdown(data: dict) -> None:
    rows = data.get("rows", [])
    lines = ["# Scale benchmark (issue 25)", "",
             "Random-weight Llama models of real shapes (bf16 safetensors, 1 GB shards, fixed seed), compressed with "
             "per-block onloading (`compress gptq|obr --set onload=true`, W4A16 + 50 % unstructured sparsity, "
             f"{NSAMPLES} x {SEQLEN} calibration tokens, unrotated, dense export in float32) on this machine "
             f"({data.get('machine', {}).get('note', '')}). Each run is its own process; peak RSS is its "
             "`ru_maxrss`. planned_mb = `toolkit.models.memory.plan_memory` (config.json only) + the RSS the "
             "process had before its first tensor (baseline_rss_mb). Weights are random: no quality figure. "
             "Generated by `make bench-scale` (examples/scale/bench.py) from results.json.", "",
             "| shape | method | threads | params | peak RSS MB | planned MB | plan/measured | seconds | s/block (mean) | "
             "s/block first→last | CPU s | CPU s/block (mean) | CPU s/block first→last |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['planned_mb'] / r['peak_rss_mb']:.2f}" if r.get("planned_mb") and r.get("peak_rss_mb")
                 else "-")
        blocks = r.get("seconds_per_block") or []
        span = f"{blocks[0]}→{blocks[-1]}" if blocks else "-"
        params = f"{r['params'] / 1e6:.0f}M" if r.get("params") else "-"
        lines.append(f"| {r['shape']} | {r['method']} | {r.get('threads', '-')} | {params} | {r.get('peak_rss_mb', '-')} | "
                     f"{r.get('planned_mb') or '-'} | {ratio} | {r.get('seconds') or '-'} | "
                     f"{r.get('seconds_per_block_mean') or '-'} | {span} | {r.get('cpu_seconds') or '-'} | "
                     f"{r.get('cpu_seconds_per_block_mean') or '-'} | {cpu_span(r)} |")
    before = data.get("rows_before", [])
    if before:  # rows a later run of the same shape and method replaced: the notes below still cite them
        lines += ["", "Earlier rows of the same shapes and methods, replaced in the table above by later runs (the notes "
                  "below cite them; each with its commit):", "",
                  "| shape | method | commit | peak RSS MB | planned MB | CPU s | CPU s/block (mean) |",
                  "|---|---|---|---|---|---|---|"]
        for r in before:
            lines.append(f"| {r['shape']} | {r['method']} | {r.get('commit', '?')} | {r.get('peak_rss_mb', '-')} | "
                         f"{r.get('planned_mb') or '-'} | {r.get('cpu_seconds') or '-'} | "
                         f"{r.get('cpu_seconds_per_block_mean') or '-'} |")
    written = data.get("models_written", {})
    if written:
        lines += ["", "Models written (random bf16, once):", "",
                  "| model | parameters | seconds | disk MB |", "|---|---|---|---|"]
        for name, info in written.items():
            lines.append(f"| {name} | {info['parameters'] / 1e6:.1f}M | {info['seconds']} | {info['disk_mb']} |")
    fits = fit_lines(rows)
    if fits:
        lines += ["", "Cost growth (computed from the rows above):", "", *fits]
    ratios = ratio_lines(rows)
    if ratios:
        lines += ["", "OBR / GPTQ per block (issue 42; CPU seconds per block, same shape, one thread):", "", *ratios]
    notes = data.get("notes", [])
    if notes:
        lines += ["", *notes]
    lines += quality_section(data.get("obr_quality_seeds", []))
    lines += solver_section(data.get("solver_study", {}))
    lines += gpu_plan_section(data.get("gpu_plan", {}))
    if data.get("notes_issue42"):
        lines += ["", *data["notes_issue42"]]
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")


def quality_section(rows: list[dict]) -> list[str]:
    """SmolLM2-135M perplexity with the issue-42 solver over calibration seeds against the solver before it."""
    summaries = [r for r in rows if r.get("summary")]
    if not summaries:
        return []
    lines = ["", "## OBR quality with the new solver (issue 42)", "",
             "SmolLM2-135M, OBR_GPTQ rotated, 16 x 256 calibration tokens of WikiText-2 valid (the seed draws the "
             "windows), perplexity on 32 x 256 windows of WikiText-2 test, as examples/obr's seed rows; before = the "
             "Jacobi-preconditioned CG to a 1e-4 residual that those rows ran.", "",
             "| setting | seeds | perplexity per seed | mean ± sd | before: mean ± sd | difference within the sd |",
             "|---|---|---|---|---|---|"]
    for s in summaries:
        per_seed = ", ".join(f"{r['ppl']}" for r in rows if not r.get("summary") and r["setting"] == s["setting"])
        lines.append(f"| {s['setting']} | {s['seeds']} | {per_seed} | {s['ppl_mean']} ± {s['ppl_sd']} | "
                     f"{s['before_mean']} ± {s['before_sd']} | {'yes' if s['within_sd'] else 'no'} |")
    first = next(r for r in rows if not r.get("summary"))
    lines += ["", f"Rows: `{first['repro']}`, e.g. `{first['command']}` (commit per row in results.json)."]
    return lines


def ratio_lines(rows: list[dict]) -> list[str]:
    """OBR's CPU seconds per block over GPTQ's for each shape measured with both (rows of the same label)."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        pair = {r["method"]: r for r in rows if r["shape"] == shape and r.get("cpu_seconds_per_block_mean")}
        if "obr" in pair and "gptq" in pair:
            o, g = pair["obr"], pair["gptq"]
            line = (f"- {shape}: OBR {o['cpu_seconds_per_block_mean']} / GPTQ {g['cpu_seconds_per_block_mean']} "
                    f"= **{o['cpu_seconds_per_block_mean'] / g['cpu_seconds_per_block_mean']:.2f}x** "
                    f"(OBR at {o.get('commit', '?')}, GPTQ at {g.get('commit', '?')}; OBR peak RSS "
                    f"{o.get('peak_rss_mb')} MB, planned {o.get('planned_mb')} MB)")
            solver = o.get("solver_per_block") or []
            if solver:
                n = len(solver)
                line += (f"; per block, mean over {n}: restoration {sum(b['restoration_s'] for b in solver) / n:.2f} "
                         f"CPU s ({sum(b['product_s'] for b in solver) / n:.2f} in products with H, "
                         f"{sum(b['preconditioner_s'] + b['setup_s'] for b in solver) / n:.2f} preconditioner + "
                         f"set-up), CG iterations {sum(b['iterations'][0] for b in solver) / n:.0f} + "
                         f"{sum(b['iterations'][1] for b in solver) / n:.0f} over its linears, max residual "
                         f"{max(b['max_residual'] for b in solver):.1e}, max loss excess "
                         f"{max(b['max_excess'] for b in solver):.1e}")
            out.append(line)
    return out


def _signed(value: float) -> str:
    return f"{value:+.1e}"


def solver_section(study: dict) -> list[str]:
    """The restoration solvers compared on the same layers (examples/scale/solvers_study.py rows)."""
    rows = [r for r in study.get("rows", []) if "restoration_cpu_s" in r]
    if not rows:
        return []
    import statistics

    from solvers_study import CANDIDATE_NOTES, DEFAULT

    lines = ["", "## OBR restoration solvers on the same layers (issue 42)", "",
             "Every candidate runs OBR_GPTQ's two restoration solves (pruning compensation, then quantization "
             "compensation) on problems captured from real runs (`examples/scale/capture.py`: W, the damped H, "
             "the Wanda mask, the scales), one thread, CPU seconds. *Restoration excess*: the pruning solve's layer "
             "loss Σ δᵀHδ over the float64 Cholesky optimum (≥ 0). *Final Δ*: the layer loss tr((W − Ŵ)H(W − Ŵ)ᵀ) "
             "after OBR_GPTQ against OBR_GPTQ on the exact restoration (either sign: rounding decides; the exact "
             "solvers themselves differ by ~1e-4 there). Speed-ups are ratios of the summed restoration seconds. "
             f"**{DEFAULT}** is what `compress obr` runs (`solver=cg`, `solver_tol=1e-3`).", ""]
    for label in dict.fromkeys(r["set"] for r in rows):
        subset = [r for r in rows if r["set"] == label]
        by = {}
        for r in subset:
            by.setdefault(r["candidate"], []).append(r)
        total = {name: sum(r["restoration_cpu_s"] for r in rs) for name, rs in by.items()}
        first = subset[0]
        lines += [f"### {label}", "",
                  f"{len({r['linear'] for r in subset})} linears, {first['rows']} rows each at most "
                  f"(`{study.get('commands', {}).get(label, '')}`); unique row masks: "
                  f"{min(r['unique_masks'] for r in subset)}–{max(r['unique_masks'] for r in subset)} of the rows "
                  "(no two rows share a mask: grouping equal masks saves nothing).", "",
                  "| candidate | restoration CPU s | × vs Cholesky | × vs Jacobi r1e-4 (before) | CG iterations "
                  "(solve 1 / 2, mean) | products share | worst restoration excess | final Δ mean (worst) |",
                  "|---|---:|---:|---:|---|---:|---:|---|"]
        for name, rs in by.items():
            seconds = total[name]
            vs_chol = f"{total['cholesky'] / seconds:.1f}" if "cholesky" in total and seconds else "-"
            vs_old = f"{total['jacobi-r1e-4'] / seconds:.1f}" if "jacobi-r1e-4" in total and seconds else "-"
            iters = (f"{statistics.mean(r['iterations'][0] for r in rs):.1f} / "
                     f"{statistics.mean(r['iterations'][1] for r in rs):.1f}") if rs[0]["iterations"][0] else "-"
            share = f"{sum(r['product_s'] for r in rs) / seconds:.2f}" if rs[0]["iterations"][0] and seconds else "-"
            worst = max(rs, key=lambda r: abs(r["final_loss_diff"]))["final_loss_diff"]
            mean = statistics.mean(r["final_loss_diff"] for r in rs)
            bold = "**" if name == DEFAULT else ""
            lines.append(f"| {bold}{name}{bold} | {seconds:.2f} | {vs_chol} | {vs_old} | {iters} | {share} | "
                         f"{_signed(max(r['restoration_excess'] for r in rs))} | {_signed(mean)} ({_signed(worst)}) |")
        default = by.get(DEFAULT, [])
        if default:
            lines += ["", f"Per linear, {DEFAULT} (seconds: products with H / preconditioner / set-up / the rest "
                          "(right-hand sides, vector updates); residual ‖r‖/‖rhs‖ reached, max over rows):", "",
                      "| linear | rows x columns | iterations | restoration s | products | preconditioner | set-up | "
                      "rest | residual (solve 1 / 2) | excess | final Δ | GPTQ s (same layer) |",
                      "|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
            blocks: dict[str, list[dict]] = {}
            for r in default:
                blocks.setdefault(r["linear"][:3], []).append(r)
                rest = r["restoration_cpu_s"] - r["product_s"] - r["preconditioner_s"] - r["setup_s"]
                lines.append(f"| {r['linear']} | {r['rows']} x {r['columns']} | {r['iterations'][0]} / "
                             f"{r['iterations'][1]} | {r['restoration_cpu_s']:.3f} | {r['product_s']:.3f} | "
                             f"{r['preconditioner_s']:.3f} | {r['setup_s']:.3f} | {rest:.3f} | "
                             f"{r['residual'][0]:.1e} / {r['residual'][1]:.1e} | {_signed(r['restoration_excess'])} | "
                             f"{_signed(r['final_loss_diff'])} | {r['gptq_layer_cpu_s']:.3f} |")
            lines += ["", "Per block (sums over its linears): " + "; ".join(
                f"{b}: restoration {sum(r['restoration_cpu_s'] for r in rs):.2f} s ({sum(r['product_s'] for r in rs):.2f} "
                f"in products), {sum(r['iterations'][0] for r in rs)} + {sum(r['iterations'][1] for r in rs)} "
                f"iterations; Jacobi r1e-4: {sum(r['restoration_cpu_s'] for r in by.get('jacobi-r1e-4', []) if r['linear'][:3] == b):.2f} s"
                for b, rs in blocks.items()), ""]
    lines += ["Candidates:", "", *[f"- `{name}`: {text}" for name, text in CANDIDATE_NOTES.items()]]
    return lines


def gpu_plan_section(plan: dict) -> list[str]:
    rows = plan.get("rows", [])
    if not rows:
        return []
    h200, eff = plan["h200"], plan["efficiency"]
    lines = ["", "## Plan for 7B-235B on GPUs — a PROJECTION, not a measurement (issue 42)", "",
             "`examples/scale/gpu_plan.py`: operation counts of what the code runs (its docstring lists them), "
             f"128 x 2048 calibration tokens, the CG iterations measured on this CPU ({plan['iterations_from']}: "
             f"{rows[0]['iterations'][0]} / {rows[0]['iterations'][1]} for the two solves), and the H200's data-sheet "
             f"peaks: FP32 {h200['fp32_tflops']} TFLOPS (the solves: torch keeps TF32 off), BF16 "
             f"{h200['bf16_tflops']} TFLOPS (the calibration forward), {h200['memory_gb']} GB. Assumed efficiencies: "
             f"GEMM-shaped work {eff['gemm']:.0%}, Cholesky/inverse {eff['factor']:.0%}, forward {eff['forward']:.0%}; "
             f"each GPTQ column step {plan['column_step_s'] * 1e6:.0f} µs of kernel launches. No GPU was lent: "
             "`make gpu-check` (scripts/obr_block_check.py) measures a 7B-shaped block the first time one is.", "",
             "| shape | blocks | linears/block | GPTQ TFLOP/block | OBR TFLOP/block | GPTQ s/block | OBR s/block | "
             "OBR/GPTQ | GPTQ h/model | OBR h/model | OBR solve peak GB | GPTQ solve peak GB | exact Cholesky, "
             "all rows GB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['blocks']} | {r['linears_per_block']} | {r['gptq_tflop_per_block']} | "
                     f"{r['obr_tflop_per_block']} | {r['gptq_s_per_block']} | {r['obr_s_per_block']} | "
                     f"{r['obr_over_gptq']} | {r['gptq_h_model']} | {r['obr_h_model']} | {r['obr_solve_peak_gb']} | "
                     f"{r['gptq_solve_peak_gb']} | {r['cholesky_all_rows_gb']} |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_compress":
        print(json.dumps(child_compress(*sys.argv[2:6])))
    elif len(sys.argv) > 1 and sys.argv[1] == "_merge":
        print(json.dumps(child_merge(*sys.argv[2:4])))
    else:
        main()
