"""Issue 30: the packed kernels run the trained lever models (shortcut / RSign+RPReLU) with the float model's
logits, bit for bit. Usage: python examples/mbunet/levers_exact.py runs/mbunet-levers"""

import json
import sys
from pathlib import Path

import torch

from toolkit.segment.data import procedural_scenes
from toolkit.segment.mbunet import load_model
from toolkit.segment.packed import convert

root = Path(sys.argv[1])
out = {}
for arch in sorted(root.glob("seed*/*/mbunet.json")):
    model, meta = load_model(arch.parent)
    if meta["variant"] == "fp32":
        continue
    scenes = procedural_scenes(16, meta.get("size", 32), meta["num_classes"], seed=123).images
    with torch.no_grad():
        reference = model(scenes)
    got = convert(model)(scenes)
    out[str(arch.parent.relative_to(root))] = {"exact": bool(torch.equal(got, reference)),
                                               "max_abs_diff": float((got - reference).abs().max())}
    print(arch.parent.relative_to(root), out[str(arch.parent.relative_to(root))], flush=True)
(root / "levers_exact.json").write_text(json.dumps(out, indent=2))
