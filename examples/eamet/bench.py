"""MEMIT vs EAMET in one run: each (model, N, method) through `iclrkit edit`, one row each in results.json.

Facts: zsRE (MEND train 1k, less 2 records with an empty target) + CounterFact (150, EasyEdit schema), real records, in that order; N above 1,148
is filled with generated facts (a real record whose subject gets the suffix " II", and a new target drawn from
another record) and the row says how many are generated. Sizes come from the environment (see repro.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHARED = Path(os.environ.get("SHARED", "/work/shared"))
OUT = Path("runs/repro-eamet")


def usable(record: dict) -> bool:
    """Two zsRE train records have an empty new target (`alt`); the loader rejects them, so they are left out."""
    prompt, target = record.get("src", record.get("prompt", "")), record.get("alt", record.get("target_new", ""))
    return bool(str(target).strip()) and record["subject"] in prompt


def facts_file(n: int) -> tuple[Path, int]:
    real = json.loads((SHARED / "data/zsre/zsre_mend_train-1k.json").read_text())
    real += json.loads((SHARED / "data/counterfact/kd-evaluate/counterfact_sample.json").read_text())
    real = [r for r in real if usable(r)]
    records = real[:n]
    generated = 0
    while len(records) < n:
        base = dict(real[generated % len(real)])
        other = real[(generated * 7 + 3) % len(real)]
        base["subject"] = base["subject"] + " II"
        for key in ("src", "rephrase", "prompt", "rephrase_prompt"):
            if key in base:
                base[key] = base[key].replace(base["subject"][:-3], base["subject"], 1)
        new_target = other.get("alt", other.get("target_new"))
        base["alt" if "alt" in base else "target_new"] = new_target
        records.append(base)
        generated += 1
    path = OUT / f"facts-{n}.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path, generated


def run_one(model: str, n: int, method: str, facts: Path, extra: list[str]) -> dict:
    name = f"{model.replace('zoo:', '')}-{n}-{method}"
    out = OUT / name
    command = [sys.executable, "-m", "cli.main", "-q", "edit", method, "-m", model, "-d", str(facts), "-n", str(n),
               "-o", str(out), "--overwrite", "--config", "examples/eamet/config.yaml",
               "--set", f"stats_dir={OUT / 'stats'}", *extra]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed: {process.stderr.read()[-500:]}")
    record = json.loads((out / "run.json").read_text())
    m, base = record["metrics"], record["baselines"].get("unedited", {})
    return {"model": model, "n_edits": n, "method": method.upper(), "efficacy": m["efficacy"],
            "generalization": m.get("generalization"), "specificity": m.get("specificity"),
            "fluency": m.get("fluency"), "seconds": round(m["edit_seconds"], 1), "wall_seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "efficacy_token_acc": m.get("efficacy_token_acc"),
            "efficacy_prob": m.get("efficacy_prob"), "specificity_token_acc": m.get("specificity_token_acc"),
            "alignment_spearman": m.get("alignment_spearman"), "value_nll": m.get("value_nll"),
            "insertion_reach": m.get("insertion_reach"), "unedited_efficacy": base.get("efficacy"),
            "unedited_specificity": base.get("specificity"), "layers": m["layers"]}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    plan = []
    for model, sizes, extra in (("zoo:smollm2-135m", os.environ.get("SMOL_N", "100 1000"),
                                 os.environ.get("SMOL_SET", "")),
                                ("zoo:gpt2-small", os.environ.get("GPT2_N", "1000 3000"),
                                 os.environ.get("GPT2_SET", ""))):
        plan += [(model, int(n), extra.split()) for n in sizes.split()]
    # per-method flags, e.g. EAMET's ‖δ‖ bound scaled to a small model (see config.yaml)
    method_extra = {"memit": os.environ.get("MEMIT_SET", "").split(), "eamet": os.environ.get("EAMET_SET", "").split()}
    results = OUT / "results.json"
    # rows already measured are kept (delete results.json to measure everything again)
    rows = json.loads(results.read_text())["rows"] if results.is_file() else []
    done = {(r["model"], r["n_edits"], r["method"]) for r in rows}
    # PARALLEL=1 runs MEMIT and EAMET of one size side by side (one thread each: on a loaded machine two
    # single-threaded processes lose less to OpenMP synchronisation than one two-threaded process)
    workers = 2 if os.environ.get("PARALLEL") == "1" else 1
    for model, n, extra in plan:
        facts, generated = facts_file(n)
        todo = [m for m in ("memit", "eamet") if (model, n, m.upper()) not in done]
        with ThreadPoolExecutor(workers) as pool:
            measured = list(pool.map(lambda m: run_one(model, n, m, facts, extra + method_extra[m]), todo))
        for row in measured:
            row["generated_facts"] = generated
            rows.append(row)
            print(json.dumps(row), flush=True)
        results.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'model':18} {'N':>5} {'method':6} {'eff':>6} {'gen':>6} {'spec':>6} {'flu':>6} {'sec':>7} {'rss':>7}")
    for r in rows:
        print(f"{r['model']:18} {r['n_edits']:>5} {r['method']:6} {r['efficacy']:>6} {r['generalization']:>6} "
              f"{r['specificity']:>6} {r['fluency']:>6} {r['seconds']:>7} {r['peak_rss_mb']:>7}")


if __name__ == "__main__":
    main()
