"""`iclrkit explain cave`: the run — data set, CAVE training, its baselines and figures, 3D-C for each.

Kept apart from `cave.py` (the model and its math) so the model module imports none of its baselines/figures,
which import it."""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from toolkit.core.errors import require
from toolkit.explain.cave import (
    CaveConfig,
    as_tensor_images,
    method_slug,
    split_accuracy,
    train_cave,
)


def _dataset(config: CaveConfig, ctx) -> dict:
    from toolkit.explain.cave_data import SyntheticSpec, build_synthetic, load_dataset, save_dataset

    if config.data.startswith("pascal3d:"):
        from toolkit.explain.cave_pascal3d import Pascal3DSpec, load_pascal3d

        data = load_pascal3d(Pascal3DSpec(root=config.data.removeprefix("pascal3d:"), classes=tuple(config.classes),
                                          image_size=config.image_size, ood_cv_root=config.ood_cv_root,
                                          nuisances=tuple(config.ood_cv_nuisances)),
                             progress=ctx.progress)
        save_dataset(data, ctx.path("dataset.npz"))
        return data
    if config.data != "synthetic":
        return load_dataset(config.data)
    require(0 <= config.occlusion_fraction < 1, "occlusion_fraction must be in [0, 1)")
    require(config.noise_std >= 0, "noise_std must be >= 0")
    spec = SyntheticSpec(n_classes=config.n_classes, n_train_per_class=config.n_train_per_class,
                         n_test_per_class=config.n_test_per_class, image_size=config.image_size,
                         occlusion_fraction=config.occlusion_fraction, noise_std=config.noise_std)
    data = build_synthetic(spec, ctx.seed, progress=ctx.progress)
    save_dataset(data, ctx.path("dataset.npz"))
    return data


def _save_attributions(ctx, method: str, maps: np.ndarray, index: np.ndarray) -> None:
    """`maps`: the positive attribution A+ that 3D-C scores; `signed`: the raw maps when they have negative values
    (LRP relevances)."""
    extra = {"signed": maps.astype(np.float32)} if (maps < 0).any() else {}
    np.savez_compressed(ctx.path(f"attributions_{method_slug(method)}.npz"),
                        maps=np.maximum(maps, 0).astype(np.float32), index=index, method=np.array(method), **extra)


def _validate(config: CaveConfig) -> None:
    for name in ("feature_dim", "width", "n_vertices", "concepts_per_class", "epochs", "batch_size",
                 "clutter_per_image", "clutter_queue"):
        require(getattr(config, name) >= 1, f"{name} must be >= 1")
    require(config.background_concepts >= 0, "background_concepts must be >= 0")
    require(config.temperature > 0 and config.lr > 0 and config.explain_temperature > 0,
            "temperature, explain_temperature and lr must be > 0")
    require(config.relevance_sigma_px >= 0, "relevance_sigma_px must be >= 0")
    require(0 <= config.bank_momentum < 1 and 0 <= config.visibility_threshold < 1,
            "bank_momentum and visibility_threshold must be in [0, 1)")


def run(config: CaveConfig, ctx) -> dict:
    from safetensors.torch import save_file

    from toolkit.explain.consistency import consistency_report

    _validate(config)
    data = _dataset(config, ctx)
    clock = time.perf_counter()
    model, training = train_cave(config, data, ctx)
    training["cave_train_s"] = time.perf_counter() - clock
    test = np.nonzero(data["split"] == "test")[0]
    require(len(test) > 0, "the dataset has no test split")
    faces = [len(data[f"mesh{c}_triangles"]) for c in range(len(data["classes"]))]
    test_images, test_labels = as_tensor_images(data["images"][test]), torch.from_numpy(data["labels"][test])

    def score(method: str, accuracy: dict, maps: np.ndarray) -> dict:
        _save_attributions(ctx, method, maps, test)
        report = consistency_report(maps, data["pix_to_face"][test], data["labels"][test], faces, data["classes"])
        return {"method": method, **accuracy, "consistency_3d": report["consistency_3d"],
                "chance_3d": report["chance_3d"], "consistency_per_class": report["per_class"]}

    cave_maps = model.explain(test_images, test_labels).numpy()
    rows = [score("CAVE", split_accuracy(model.predict, data), cave_maps)]
    save_file({**{f"backbone.{k}": v.contiguous() for k, v in model.backbone.state_dict().items()},
               "concepts": model.concepts, "concept_class": model.concept_class, "bank": model.bank},
              str(ctx.path("cave.safetensors")))
    baseline_maps = {}
    if config.baselines:
        from toolkit.explain.cave_baselines import baseline_rows

        clock = time.perf_counter()
        for method, accuracy, maps in baseline_rows(config, data, ctx):
            rows.append(score(method, accuracy, maps))
            baseline_maps[method] = maps
        training["baselines_s"] = time.perf_counter() - clock
    if config.figures:
        from toolkit.explain.cave_figures import concept_figures

        concept_figures(ctx, data, test, {"CAVE": cave_maps, **baseline_maps})
    ctx.path("results.json").write_text(json.dumps({"rows": rows, "training": training}, indent=2))
    ctx.metrics.update({"rows": rows, **training, "n_train": int((data["split"] == "train").sum()),
                        "n_test": int(len(test)), "classes": [str(c) for c in data["classes"]]})
    return {"rows": rows}
