"""MoE compression benchmark (issue 41): a random-weight Mixtral of a real width, compressed with per-block onloading.

    python examples/moe/bench.py [--work DIR] [--model DIR]      # --model: any local MoE checkpoint instead

The random model: 8 experts, top-2, hidden 1024, expert width 2816, 16 heads (4 KV heads), 4 blocks, saved as a
transformers checkpoint (experts stored one by one, as checkpoints are). No real MoE checkpoint is available offline;
with --model the same measurements run unchanged on a real one.

Each compress runs in its own process (`compress rtn|gptq`, W4A16, onload=true, 16 x 256 calibration tokens of the
embedded text), so its peak RSS (getrusage ru_maxrss) is its own; the plan is toolkit.models.memory.plan_memory from
config.json plus the RSS the process had before its first tensor. Measured:
- per expert, the layer loss of GPTQ's and RTN's weights, tr(dW H dW^T) / tr(W H W^T), with H each expert's
  Hessian from the tokens the router sends it in the uncompressed model (gate/up and down projections);
- CPU seconds per block with routed calibration and with every expert calibrated on every token;
- peak RSS against the plan.

Rows go to examples/moe/results.json (with command, commit, date, machine); RESULTS.md's table is written from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MB = 2**20
NSAMPLES, SEQLEN = 16, 256
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=1024)


def rss_bytes() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def write_model(path: Path) -> dict:
    import torch
    import transformers

    from toolkit.data.text import embedded_text
    from toolkit.zoo.lm import train_tokenizer

    tokenizer = train_tokenizer(embedded_text()[:400_000], vocab_size=4096)
    config = transformers.MixtralConfig(vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        **SHAPE)
    torch.manual_seed(0)
    started = time.perf_counter()
    model = transformers.MixtralForCausalLM(config).eval()
    model.save_pretrained(path, max_shard_size="500MB")
    tokenizer.save_pretrained(path)
    return {"seconds": round(time.perf_counter() - started, 1),
            "parameters": sum(p.numel() for p in model.parameters())}


# -- child processes: one compress each, its own peak RSS -------------------------------------------------------------

def child_compress(model: str, method: str, calibration: str, out: str) -> dict:
    import torch

    import toolkit.compress.solvers  # noqa: F401 - imported before the baseline, as the run imports it
    from toolkit.compress.config import GptqConfig, RtnConfig
    from toolkit.compress.recipe import run_compress
    from toolkit.core.context import RUN_WARNINGS, RunContext
    from toolkit.models.memory import block_dims, plan_memory, skeleton
    from toolkit.models.view import view_of

    torch.set_num_threads(1)  # the benchmark's process policy: one thread, CPU seconds comparable across rows
    baseline = rss_bytes()
    cls = GptqConfig if method == "gptq" else RtnConfig
    config = cls(model=model, data="embedded", nsamples=NSAMPLES, seqlen=SEQLEN, w_bits=4, a_bits=16, kv_bits=16,
                 rotate=False, export="dense", onload=True, moe_calibration=calibration)
    batched = config.fused_calibration_fits(NSAMPLES, SEQLEN, block_dims(view_of(skeleton(model))))
    plan = plan_memory(model, nsamples=NSAMPLES, seqlen=SEQLEN, runtime_bytes=baseline, batched=batched)
    ctx = RunContext(out=Path(out), quiet=True)
    run_compress(config, ctx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"cpu_seconds_per_block": [round(t, 1) for t in ctx.metrics["cpu_seconds_per_block"]],
            "peak_rss_mb": round(peak / MB), "planned_mb": round(plan["peak_bytes"]["cpu"] / MB),
            "baseline_rss_mb": round(baseline / MB), "plan_mb": plan["mb"], "calibration": ctx.metrics["calibration"],
            "expert_tokens": ctx.metrics.get("expert_tokens", {}), "warnings": list(RUN_WARNINGS)}


def run_child(*args: str) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # the CLI's onload policy
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"child failed ({' '.join(args)}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- layer loss per expert --------------------------------------------------------------------------------------------

def expert_hessians(model_dir: Path) -> dict:
    """{(block, param, expert): H} from the uncompressed model on the calibration windows, routed tokens only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toolkit.data.text import calibration_windows, load_text
    from toolkit.models.view import view_of
    from toolkit.nn.pipeline import run_sequential

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    windows = calibration_windows(AutoTokenizer.from_pretrained(model_dir), load_text("embedded"), NSAMPLES, SEQLEN,
                                  0)
    hessians = {}

    def on_block(step):
        groups = [g for g in step.layout.groups if g.experts]
        for group, tap in zip(groups, step.group_hessians(groups, torch.float64)):
            for slot in group.slots:
                accumulator = tap.accumulators()[slot.name]
                hessians[(step.index, slot.param, slot.expert)] = accumulator.H.clone()

    run_sequential(model, windows, on_block, view=view_of(model))
    return hessians, model.state_dict()


def layer_losses(hessians: dict, original: dict, compressed_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    compressed = AutoModelForCausalLM.from_pretrained(compressed_dir, dtype=torch.float32).state_dict()
    losses = {}
    for (block, param, expert), H in hessians.items():
        name = f"model.layers.{block}.mlp.experts.{param}"
        W, Q = original[name][expert].double(), compressed[name][expert].double()
        delta = W - Q
        losses[(block, param, expert)] = float((delta @ H * delta).sum() / (W @ H * W).sum())
    return losses


# -- driver -----------------------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "moe-bench")
    parser.add_argument("--model", type=Path, help="a local MoE checkpoint to measure instead of the random one")
    parser.add_argument("--child", nargs=4, metavar=("MODEL", "METHOD", "CALIBRATION", "OUT"))
    parser.add_argument("--render", action="store_true", help="rewrite RESULTS.md's table from results.json")
    args = parser.parse_args()
    if args.render:
        render(json.loads((HERE / "results.json").read_text()))
        return
    if args.child:
        print(json.dumps(child_compress(*args.child)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    model_dir = args.model or args.work / "mixtral-random"
    made = None
    if args.model is None and not (model_dir / "config.json").is_file():
        made = write_model(model_dir)
    runs = {}
    for method, calibration in (("rtn", "routed"), ("gptq", "routed"), ("gptq", "all")):
        out = args.work / f"{method}-{calibration}"
        if out.exists():
            import shutil

            shutil.rmtree(out)
        runs[(method, calibration)] = run_child(str(model_dir), method, calibration, str(out))
        print(method, calibration, runs[(method, calibration)]["cpu_seconds_per_block"], flush=True)
    hessians, original = expert_hessians(model_dir)
    losses = {key: layer_losses(hessians, original, args.work / f"{key[0]}-{key[1]}" / "model") for key in runs}
    write_rows(args, model_dir, made, runs, losses)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_rows(args, model_dir, made, runs, losses) -> None:
    import statistics

    rtn = losses[("rtn", "routed")]
    rows = []
    for (method, calibration), run in runs.items():
        loss = losses[(method, calibration)]
        row = {"method": method, "moe_calibration": calibration,
               "cpu_seconds_per_block_mean": round(statistics.mean(run["cpu_seconds_per_block"]), 1),
               "cpu_seconds_per_block": run["cpu_seconds_per_block"], "peak_rss_mb": run["peak_rss_mb"],
               "planned_mb": run["planned_mb"], "plan_over_peak": round(run["planned_mb"] / run["peak_rss_mb"], 3),
               "calibration": run["calibration"], "warnings": run["warnings"]}
        for param in ("gate_up_proj", "down_proj"):
            values = [v for (b, p, e), v in loss.items() if p == param]
            ratios = [v / rtn[k] for k, v in loss.items() if k[1] == param]
            row[f"layer_loss_{param}_mean"] = round(statistics.mean(values), 5)
            row[f"vs_rtn_{param}"] = {"mean": round(statistics.mean(ratios), 3), "min": round(min(ratios), 3),
                                      "max": round(max(ratios), 3),
                                      "experts_below_rtn": f"{sum(r < 1 for r in ratios)}/{len(ratios)}"}
        row["expert_tokens_block0"] = run["expert_tokens"].get("model.layers.0.mlp.experts.gate_up_proj")
        rows.append(row)
    record = {"model": str(model_dir) if args.model else "random Mixtral " + json.dumps(SHAPE),
              "calibration_tokens": f"{NSAMPLES} x {SEQLEN} (embedded text)", "rows": rows,
              "command": "python examples/moe/bench.py" + (f" --model {args.model}" if args.model else ""),
              "commit": _commit(), "date": datetime.date.today().isoformat(),
              "machine": f"{os.cpu_count()} cores, one thread per run, shared with other jobs (CPU seconds)",
              "repro": "examples/moe/bench.py", "seed": 0,  # the random model's weights (torch.manual_seed(0))
              "model_written": made}
    for row in rows:  # every row carries its provenance (tests/unit/test_published_figures.py)
        row.update({k: record[k] for k in ("command", "commit", "date", "machine", "repro", "seed")})
    (HERE / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    render(record)
    print(json.dumps(rows, indent=1))


def table(record: dict) -> str:
    lines = ["| method | experts calibrated on | layer loss gate/up (mean) | vs RTN, per expert: mean [min, max], "
             "below RTN | layer loss down (mean) | vs RTN, per expert | CPU s / block | peak RSS MB | plan MB "
             "(plan / peak) |", "|---|---|---:|---|---:|---|---:|---:|---:|"]
    for row in record["rows"]:
        def ratio(param):
            r = row[f"vs_rtn_{param}"]
            return f"{r['mean']} [{r['min']}, {r['max']}], {r['experts_below_rtn']}"
        lines.append(f"| {row['method']} | {row['moe_calibration']} | {row['layer_loss_gate_up_proj_mean']} | "
                     f"{ratio('gate_up_proj')} | {row['layer_loss_down_proj_mean']} | {ratio('down_proj')} | "
                     f"{row['cpu_seconds_per_block_mean']} | {row['peak_rss_mb']} | {row['planned_mb']} "
                     f"({row['plan_over_peak']}) |")
    return "\n".join(lines)


def render(record: dict) -> None:
    """RESULTS.md's table between its markers, from results.json (the prose around it is hand-written)."""
    path = HERE / "RESULTS.md"
    begin, end = "<!-- table:begin -->", "<!-- table:end -->"
    text = path.read_text() if path.is_file() else f"# MoE compression\n\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    stamp = (f"{record['model']}; {record['calibration_tokens']}; `{record['command']}` at {record['commit']}, "
             f"{record['date']}, {record['machine']}.")
    path.write_text(f"{head}{begin}\n{table(record)}\n\n{stamp}\n{end}{tail}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
