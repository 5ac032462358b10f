"""Re-insert the saved δ of finished edit runs at other λ (the value stage is not redone).

    python examples/eamet/lambda_sweep.py --lambdas 500,1000,4000 RUN_DIR [RUN_DIR ...] [--out runs/eamet-sweep]

Each RUN_DIR is the out dir of an `iclrkit edit memit|eamet` run (it holds run.json and values.safetensors). Every
point reuses that run's whole config with only mom2_update_weight changed, so MEMIT and EAMET keep their own δ and
share λ, C and the layers. Rows (the source run itself included, at its own λ) go to OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

ROW_METRICS = ("efficacy", "generalization", "specificity", "fluency", "efficacy_token_acc", "efficacy_prob",
               "value_nll", "insertion_reach", "alignment_spearman", "edit_seconds")


def row(run_dir: Path, source: Path) -> dict:
    record = json.loads((run_dir / "run.json").read_text())
    config, metrics = record["config"], record["metrics"]
    return {"source": str(source), "method": record["technique"].split(".")[-1].upper(),
            "cs_factor": config.get("cs_factor"), "mse_factor": config.get("mse_factor"),
            "n_edits": metrics["n_edits"], "lambda": config["mom2_update_weight"],
            **{key: metrics.get(key) for key in ROW_METRICS}}


def reinsert(source: Path, lam: float, out: Path) -> Path:
    record = json.loads((source / "run.json").read_text())
    # the unedited model scores as in the source run, so it is not scored again
    config = dict(record["config"], mom2_update_weight=lam, values=str(source), save_model=False, eval_before=False)
    target = out / f"{source.name}-lambda{lam:g}"
    config_file = out / f"{target.name}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    method = record["technique"].split(".")[-1]
    command = [sys.executable, "-m", "cli.main", "-q", "edit", method, "-m", config["model"], "-d", config["data"],
               "-o", str(target), "--overwrite", "--config", str(config_file)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--lambdas", required=True, help="comma-separated λ values")
    parser.add_argument("--out", type=Path, default=Path("runs/eamet-sweep"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row(source, source) for source in args.runs]
    for lam in (float(x) for x in args.lambdas.split(",")):
        for source in args.runs:
            rows.append(row(reinsert(source, lam, args.out), source))
            print(json.dumps(rows[-1]), flush=True)
            (args.out / "results.json").write_text(json.dumps({"rows": rows}, indent=2))
    print(f"{'source':28} {'λ':>6} {'eff':>6} {'gen':>6} {'spec':>5} {'flu':>6} {'reach':>6} {'nll':>6}")
    for r in sorted(rows, key=lambda r: (r["lambda"], r["source"])):
        print(f"{Path(r['source']).name:28} {r['lambda']:>6g} {r['efficacy']:>6} {r['generalization']:>6} "
              f"{r['specificity']:>5} {r['fluency']:>6} {r['insertion_reach']:>6} {r['value_nll']:>6}")


if __name__ == "__main__":
    main()
