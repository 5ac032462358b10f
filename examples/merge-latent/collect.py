"""Collect the run.json files of repro.sh into results.json (the issue's shape) and print the table.

Digits rows: acc_* are 10-way test accuracies (%). GPT-2 rows: acc_* are next-token top-1 accuracies (%) on each
parent's held-out text (union = the two texts equally weighted), and ppl_task_a / ppl_task_b / ppl_union hold the
perplexities (union = exp of the mean of the two mean NLLs)."""

import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
SCORES = ("acc_task_a", "acc_task_b", "acc_union", "ppl_task_a", "ppl_task_b", "ppl_union")


def scored(pair: str, method: str, metrics: dict) -> dict:
    return {"pair": pair, "method": method, **{k: round(metrics[k], 2) for k in SCORES if k in metrics}}


rows = []
for run in sorted(root.glob("merges/*/*/run.json")):
    record = json.loads(run.read_text())
    pair, method = run.parent.parent.name, run.parent.name.replace("_", " ")
    rows.append({**scored(pair, method, record["metrics"]), "seconds": round(record["duration_s"], 2)})
    if method in ("average", "padded average"):
        for index, name in ((0, "parent A"), (1, "parent B")):
            rows.append(scored(pair, name, record["baselines"][f"parent{index}"]))
order = ["parent A", "parent B", "average", "padded average", "unit-matched average", "widened average",
         "task arithmetic", "ties", "latent", "latent full code", "latent slerp", "latent pure",
         "latent pure full code", "latent pure lambda0 control"]
rows.sort(key=lambda r: (r["pair"], order.index(r["method"]) if r["method"] in order else 99))
results = {"rows": rows}
for prefix, vae, zoo in (("", "vae", "zoo"), ("cnn_", "cnn-vae", "cnn-zoo"), ("gpt2_", "gpt2-vae", "gpt2-zoo")):
    if not (root / vae / "run.json").is_file():
        continue
    run = json.loads((root / vae / "run.json").read_text())
    results.update({f"{prefix}vae_recon_rel_err": run["metrics"]["vae_recon_rel_err"],
                    f"{prefix}vae_reconstruction": run["metrics"]["reconstruction"],
                    f"{prefix}vae_train_seconds": round(run["duration_s"], 1),
                    f"{prefix}zoo": json.loads((root / zoo / "run.json").read_text())["metrics"]["models"]})
(root / "results.json").write_text(json.dumps(results, indent=2))
print(f"{'pair':<26} {'method':<28} {'task A':>7} {'task B':>7} {'union':>7}  ppl A / B / union")
for r in rows:
    ppl = f"  {r['ppl_task_a']:.1f} / {r['ppl_task_b']:.1f} / {r['ppl_union']:.1f}" if "ppl_union" in r else ""
    print(f"{r['pair']:<26} {r['method']:<28} {r['acc_task_a']:>7.1f} {r['acc_task_b']:>7.1f} {r['acc_union']:>7.1f}{ppl}")
for prefix in ("", "cnn_", "gpt2_"):
    if f"{prefix}vae_recon_rel_err" in results:
        print(f"{prefix or 'mlp_'}VAE relative L2 reconstruction error:", json.dumps(results[f"{prefix}vae_recon_rel_err"]))
