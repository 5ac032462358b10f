"""Collect the run.json files of repro.sh into results.json (the issue's shape) and print the table."""

import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
rows = []
for run in sorted(root.glob("merges/*/*/run.json")):
    record = json.loads(run.read_text())
    pair, method = run.parent.parent.name, run.parent.name.replace("_", " ")
    m = record["metrics"]
    rows.append({"pair": pair, "method": method, "acc_task_a": round(m["acc_task_a"], 2),
                 "acc_task_b": round(m["acc_task_b"], 2), "acc_union": round(m["acc_union"], 2),
                 "seconds": round(record["duration_s"], 2)})
    if method.startswith("average") or method.startswith("padded"):
        for index, name in ((0, "parent A"), (1, "parent B")):
            p = record["baselines"][f"parent{index}"]
            rows.append({"pair": pair, "method": name, "acc_task_a": round(p["acc_task_a"], 2),
                         "acc_task_b": round(p["acc_task_b"], 2), "acc_union": round(p["acc_union"], 2)})
order = ["parent A", "parent B", "average", "padded average", "unit-matched average", "task arithmetic", "ties",
         "latent", "latent full code", "latent slerp", "latent pure", "latent pure full code",
         "latent pure lambda0 control"]
rows.sort(key=lambda r: (r["pair"], order.index(r["method"]) if r["method"] in order else 99))
vae = json.loads((root / "vae" / "run.json").read_text())["metrics"]
results = {"rows": rows, "vae_recon_rel_err": vae["vae_recon_rel_err"],
           "vae_reconstruction": vae["reconstruction"], "vae_train_seconds":
           round(json.loads((root / "vae" / "run.json").read_text())["duration_s"], 1),
           "zoo": json.loads((root / "zoo" / "run.json").read_text())["metrics"]["models"]}
if (root / "cnn-vae" / "run.json").is_file():
    cnn = json.loads((root / "cnn-vae" / "run.json").read_text())
    results.update({"cnn_vae_recon_rel_err": cnn["metrics"]["vae_recon_rel_err"],
                    "cnn_vae_reconstruction": cnn["metrics"]["reconstruction"],
                    "cnn_vae_train_seconds": round(cnn["duration_s"], 1),
                    "cnn_zoo": json.loads((root / "cnn-zoo" / "run.json").read_text())["metrics"]["models"]})
(root / "results.json").write_text(json.dumps(results, indent=2))
print(f"{'pair':<22} {'method':<28} {'task A':>7} {'task B':>7} {'union':>7}")
for r in rows:
    print(f"{r['pair']:<22} {r['method']:<28} {r['acc_task_a']:>7.1f} {r['acc_task_b']:>7.1f} {r['acc_union']:>7.1f}")
print("VAE relative L2 reconstruction error:", json.dumps(results["vae_recon_rel_err"]))
if "cnn_vae_recon_rel_err" in results:
    print("CNN VAE relative L2 reconstruction error:", json.dumps(results["cnn_vae_recon_rel_err"]))
