"""MEMIT vs EAMET in one run: each (model, N, method) through `iclrkit edit`, one row each in results.json.

Facts: zsRE (MEND train 1k, less 2 records with an empty target) + CounterFact (150, EasyEdit schema), real
records, in that order. The last VALIDATION (30) records of that pool (CounterFact kd-evaluate records 120-149) are
the validation facts for choosing EAMET's alignment weight (select_weight.py) and are in no test set: test sets are
the first N of the other 1,118, and N above 1,118 is filled with generated facts (a test record whose subject gets
the suffix " II", and a new target drawn from another test record); the row says how many are generated and how
many facts come from each dataset. Sizes come from the environment (see repro.sh). Data root: $ICLRKIT_DATA,
default ../shared/data beside the project.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("ICLRKIT_DATA", ROOT.parent / "shared" / "data"))
OUT = Path("runs/repro-eamet")
VALIDATION = 30  # the pool's last records: validation only, never a test fact nor the base of a generated one


def usable(record: dict) -> bool:
    """Two zsRE train records have an empty new target (`alt`); the loader rejects them, so they are left out."""
    prompt, target = record.get("src", record.get("prompt", "")), record.get("alt", record.get("target_new", ""))
    return bool(str(target).strip()) and record["subject"] in prompt


def dataset_of(record: dict) -> str:
    return "zsre" if "src" in record else "counterfact"


def real_pool() -> list[dict]:
    real = json.loads((DATA / "zsre/zsre_mend_train-1k.json").read_text())
    real += json.loads((DATA / "counterfact/kd-evaluate/counterfact_sample.json").read_text())
    return [r for r in real if usable(r)]


def split_pool(real: list[dict], n_validation: int = VALIDATION) -> tuple[list[dict], list[dict]]:
    """(test pool, validation facts): the validation facts are the pool's tail, so every test set (a prefix of the
    test pool, or all of it plus facts generated from it) is disjoint from them."""
    return real[:len(real) - n_validation], real[len(real) - n_validation:]


def prompt_of(record: dict) -> str:
    return record.get("src", record.get("prompt", ""))


def test_facts(pool: list[dict], n: int) -> tuple[list[dict], int]:
    """The first n test facts; beyond the pool, generated facts built from test-pool records only."""
    records = pool[:n]
    generated = 0
    while len(records) < n:
        base = dict(pool[generated % len(pool)])
        other = pool[(generated * 7 + 3) % len(pool)]
        base["subject"] = base["subject"] + " II"
        for key in ("src", "rephrase", "prompt", "rephrase_prompt"):
            if key in base:
                base[key] = base[key].replace(base["subject"][:-3], base["subject"], 1)
        new_target = other.get("alt", other.get("target_new"))
        base["alt" if "alt" in base else "target_new"] = new_target
        records.append(base)
        generated += 1
    return records, generated


def check_disjoint(validation: list[dict], test: list[dict]) -> None:
    """No validation fact shares its subject or its prompt with a test fact."""
    subjects = {r["subject"] for r in test}
    prompts = {prompt_of(r) for r in test}
    clash = [r["subject"] for r in validation if r["subject"] in subjects or prompt_of(r) in prompts]
    if clash:
        raise SystemExit(f"validation facts overlap the test set: {clash[:5]}")


def write_facts(records: list[dict], name: str) -> Path:
    path = OUT / name
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def facts_file(n: int, dataset: str = "pool") -> tuple[Path, int, dict]:
    """The first n test facts of the pool ("pool": zsRE first, then CounterFact, then generated) or of one
    dataset's part of it ("zsre" | "counterfact"; n beyond that part is filled with generated facts of it)."""
    pool, validation = split_pool(real_pool())
    if dataset != "pool":
        pool = [r for r in pool if dataset_of(r) == dataset]
    records, generated = test_facts(pool, n)
    check_disjoint(validation, records)
    counts = {name: sum(dataset_of(r) == name for r in records) for name in ("zsre", "counterfact")}
    suffix = "" if dataset == "pool" else f"-{dataset}"
    return write_facts(records, f"facts{suffix}-{n}.jsonl"), generated, counts


def validation_file() -> Path:
    return write_facts(split_pool(real_pool())[1], "facts-val.jsonl")


def run_one(model: str, n: int, method: str, facts: Path, extra: list[str], tag: str = "") -> dict:
    name = f"{model.replace('zoo:', '')}-{n}-{method}{tag}"
    out = OUT / name
    command = [sys.executable, "-m", "cli.main", "-q", "edit", method, "-m", model, "-d", str(facts), "-n", str(n),
               "-o", str(out), "--overwrite", "--config", "examples/eamet/config.yaml",
               "--set", f"stats_dir={OUT / 'stats'}", "--set", f"cov_data={DATA / 'wikitext-2/valid.txt'}", *extra]
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
            "specificity_zsre_per_token": m.get("specificity_zsre_per_token"),
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
    # rows written before the dataset field came from the zsRE-first pool
    done = {(r["model"], r["n_edits"], r["method"], r.get("dataset", "zsre")) for r in rows}
    # PARALLEL=1 runs MEMIT and EAMET of one size side by side (one thread each: on a loaded machine two
    # single-threaded processes lose less to OpenMP synchronisation than one two-threaded process)
    workers = 2 if os.environ.get("PARALLEL") == "1" else 1
    # DATASET: "pool" (default: zsRE first, then CounterFact), "zsre" or "counterfact" (that dataset's facts only)
    dataset = os.environ.get("DATASET", "pool")
    if dataset not in ("pool", "zsre", "counterfact"):
        raise SystemExit(f"DATASET must be pool, zsre or counterfact, got {dataset!r}")
    tag = "" if dataset == "pool" else f"-{dataset}"
    for model, n, extra in plan:
        facts, generated, counts = facts_file(n, dataset)
        label = max(counts, key=counts.get)  # the dataset most facts come from; the exact counts beside it
        todo = [m for m in ("memit", "eamet") if (model, n, m.upper(), label) not in done]
        with ThreadPoolExecutor(workers) as pool:
            measured = list(pool.map(lambda m: run_one(model, n, m, facts, extra + method_extra[m], tag), todo))
        for row in measured:
            row["generated_facts"] = generated
            row["dataset"] = label
            row["facts_by_dataset"] = counts
            rows.append(row)
            print(json.dumps(row), flush=True)
        results.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'model':18} {'N':>5} {'method':6} {'eff':>6} {'gen':>6} {'spec':>6} {'flu':>6} {'sec':>7} {'rss':>7}")
    for r in rows:
        print(f"{r['model']:18} {r['n_edits']:>5} {r['method']:6} {r['efficacy']:>6} {r['generalization']:>6} "
              f"{r['specificity']:>6} {r['fluency']:>6} {r['seconds']:>7} {r['peak_rss_mb']:>7}")


if __name__ == "__main__":
    main()
