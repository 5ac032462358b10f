"""Issue 30: 3D-C of CAVE's explanations (NOV-aware LRP = the default, the earlier Gaussian stand-in, LRP with zplus
on the last conv) and of the 2D baselines (NMF, Grad-CAM, the CNN's LRP) on a finished `explain cave` run:
reuses OUT/cave.safetensors and OUT/dataset.npz (no CAVE retraining), retrains the 2D CNN (deterministic for the
seed and thread count, so it is the run's CNN when the thread count matches).

Usage: OMP_NUM_THREADS=1 .venv/bin/python examples/cave/lrp_remeasure.py runs/repro-cave [--seed 0]
Writes OUT/lrp_remeasure.json and prints the table; also the conservation error of the LRP maps."""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from toolkit.core.config import load_yaml
from toolkit.explain.cave import Backbone, CaveConfig, CaveModel, as_tensor_images, concept_relevance
from toolkit.explain.cave_baselines import baseline_rows
from toolkit.explain.cave_data import load_dataset
from toolkit.explain.consistency import consistency_report

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--config", default="examples/cave/config.yaml")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--no-baselines", action="store_true")
args = parser.parse_args()

config = CaveConfig(**{**load_yaml(args.config), "baseline_lrp": True})
data = load_dataset(args.out / "dataset.npz")
weights = load_file(str(args.out / "cave.safetensors"))
backbone = Backbone(config.feature_dim, config.width)
backbone.load_state_dict({k.removeprefix("backbone."): v for k, v in weights.items() if k.startswith("backbone.")})
n_classes = len(data["classes"])
test = np.nonzero(data["split"] == "test")[0]
images, labels = as_tensor_images(data["images"][test]), torch.from_numpy(data["labels"][test])
faces = [len(data[f"mesh{c}_triangles"]) for c in range(n_classes)]


def score(maps):
    report = consistency_report(np.asarray(maps, dtype=np.float64), data["pix_to_face"][test], data["labels"][test],
                                faces, data["classes"])
    return {"consistency_3d": report["consistency_3d"], "chance_3d": report["chance_3d"],
            "consistency_per_class": report["per_class"]}


def cave(explanation, top="epsilon"):
    return CaveModel(backbone, weights["concepts"], weights["concept_class"], weights["bank"], n_classes,
                     config.classifier, config.explain_temperature, config.relevance_sigma_px, explanation, top)


rows = []
for name, model in (("CAVE, NOV-aware LRP (default)", cave("lrp")), ("CAVE, Gaussian stand-in", cave("gaussian")),
                    ("CAVE, LRP zplus on the last conv", cave("lrp", "zplus"))):
    clock = time.perf_counter()
    maps = model.explain(images, labels)
    row = {"method": name, **score(maps.numpy()), "explain_s": round(time.perf_counter() - clock, 1)}
    if model.explanation == "lrp":
        cos = torch.einsum("bdhw,md->bmhw", model.features(images), model.concepts)
        explained = concept_relevance(cos, model.concept_class, labels, model.classifier, model.explain_temperature)
        err = (maps.sum((2, 3)) - explained.sum((2, 3))).abs()
        row["conservation_max_abs_err"] = float(err.max())
        row["explained_mean"] = float(explained.sum((2, 3)).mean())
        row["positive_share"] = float(maps.clamp(min=0).sum() / maps.abs().sum())
    rows.append(row)
    print(row, flush=True)


class _Ctx:
    seed = args.seed

    @staticmethod
    def progress(iterable, **_):
        return iterable


if not args.no_baselines:
    for method, accuracy, maps in baseline_rows(config, data, _Ctx):
        rows.append({"method": method, **score(maps)})
        print(rows[-1], flush=True)
(args.out / "lrp_remeasure.json").write_text(json.dumps({"rows": rows, "seed": args.seed}, indent=2))
print(f"{'method':40s} {'3D-C':>7s}")
for row in rows:
    print(f"{row['method']:40s} {row['consistency_3d']:7.3f}")
