#!/usr/bin/env bash
# CAVE vs 2D concept baselines on the synthetic posed set: accuracy (iid, occlusion, texture, noise) and 3D-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=runs/repro-cave
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
$PY -m cli.main explain cave --config examples/cave/config.yaml --seed 0 --out "$OUT" --overwrite
$PY - "$OUT/results.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
cols = ["acc_iid", "acc_occlusion", "acc_texture", "acc_noise", "acc_unseen_pose", "consistency_3d", "chance_3d"]
print(f"{'method':38s}" + "".join(f"{c:>16s}" for c in cols))
for r in rows:
    print(f"{r['method']:38s}" + "".join(f"{r[c]:16.3f}" if r.get(c) is not None else f"{'-':>16s}" for c in cols))
PYEOF
