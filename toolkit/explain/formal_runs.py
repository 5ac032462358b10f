"""What `explain fame` and `explain verix` share: images in, sample selection, the per-image loop (explain, attack
for the lower bound, optional exact refinement and verification), explanation masks JSON and PNG overlays."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError, require
from toolkit.explain.attacks import necessary_features
from toolkit.explain.crown import box_domains, certified, epsilon_box
from toolkit.explain.exact import exact_check
from toolkit.explain.net import AffineNet, load_net


@dataclass
class Sample:
    index: int
    label: int
    x0: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor


def load_images(data: str, net: AffineNet) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(N, n) float64 images in [0, 1] and labels (or None) from digits[:split], .npy or .npz (x, optional y)."""
    import numpy as np

    if data.startswith("digits"):
        from toolkit.explain.digits import digits_split

        images, labels = digits_split(data.partition(":")[2] or "test")
    else:
        path = Path(data)
        require(path.is_file(), f"data file not found: {data}", "use digits, a .npy or a .npz file")
        try:
            loaded = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise BadInputError(f"cannot read {data} as .npy/.npz: {exc}") from None
        if isinstance(loaded, np.ndarray):
            images, labels = loaded, None
        else:
            key = next((k for k in ("x", "images") if k in loaded.files), None)
            require(key is not None, f"{data} has no array 'x' (or 'images'); found {loaded.files}")
            images = loaded[key]
            labels = next((loaded[k] for k in ("y", "labels") if k in loaded.files), None)
        images = torch.as_tensor(np.asarray(images, dtype=np.float64))
        labels = torch.as_tensor(np.asarray(labels)).long().reshape(-1) if labels is not None else None
    images = images.double()
    require(images.dim() >= 1 and images.shape[0] > 0, f"no images in {data}")
    require(images[0].numel() == net.n_inputs,
            f"images in {data} have {images[0].numel()} values each; the model expects {net.input_shape}")
    images = images.reshape(images.shape[0], -1)
    require(bool(torch.isfinite(images).all()), f"images in {data} contain NaN or inf")
    require(bool(((images >= 0) & (images <= 1)).all()), f"image values in {data} must lie in [0, 1]",
            "rescale the images (the perturbation box is clipped to [0, 1])")
    if labels is not None:
        require(len(labels) == len(images), f"{data}: {len(labels)} labels for {len(images)} images")
    return images, labels


def select_samples(net: AffineNet, images, labels, epsilon: float, start: int, count: int,
                   skip_robust: bool) -> tuple[list[Sample], dict]:
    """The first `count` images from `start` that are classified correctly (when labels are known) and, with
    skip_robust, not already certified on the whole box (their explanation would be empty)."""
    chosen, skipped = [], {"misclassified": 0, "robust": 0}
    everything = torch.ones(1, net.n_features, dtype=torch.bool)
    for index in range(start, len(images)):
        if len(chosen) == count:
            break
        x0 = images[index]
        label = int(net(x0).argmax())
        if labels is not None and label != int(labels[index]):
            skipped["misclassified"] += 1
            continue
        lower, upper = epsilon_box(x0, epsilon)
        if skip_robust and bool(certified(net, box_domains(net, x0, lower, upper, everything), label)[0]):
            skipped["robust"] += 1
            continue
        chosen.append(Sample(index, label, x0, lower, upper))
    require(len(chosen) > 0, "no image qualifies (all misclassified or already robust on the whole box)",
            "lower --start, raise --epsilon or pass --set skip_robust=false")
    return chosen, skipped


def explain_images(config, ctx, method: str, explain: Callable[[AffineNet, Sample], tuple[torch.Tensor, dict]],
                   refine: str = "none") -> dict:
    """Explain every selected image; write explanations.json (+ overlays.png); return the metrics.
    `explain` returns the freed pixels (P,) bool and extra per-image fields for explanations.json."""
    require(0 < config.epsilon <= 1, f"epsilon must be in (0, 1], got {config.epsilon}")
    require(config.n_samples >= 1 and config.start >= 0, "n_samples must be >= 1 and start >= 0")
    net, _ = load_net(config.model)
    ctx.inputs["model"] = config.model
    images, labels = load_images(config.data, net)
    samples, skipped = select_samples(net, images, labels, config.epsilon, config.start, config.n_samples,
                                      config.skip_robust)
    records = []
    for number, sample in enumerate(ctx.progress(samples, total=len(samples), description=f"{method}")):
        records.append(explain_one(net, sample, explain, config, refine, seed=ctx.seed + number))
    metrics = summarise(records, skipped, method)
    write_explanations(ctx, net, method, records, config.epsilon)
    if config.overlays > 0:
        draw_overlays(ctx.path("overlays.png"), net, images, records[:config.overlays])
    ctx.metrics.update(metrics)
    return metrics


def explain_one(net: AffineNet, sample: Sample, explain, config, refine: str, seed: int) -> dict:
    clock = time.perf_counter()
    free, details = explain(net, sample)
    seconds = time.perf_counter() - clock
    clock = time.perf_counter()
    necessary = necessary_features(net, sample.x0, sample.lower, sample.upper, free, sample.label, config.attack,
                                   config.attack_steps, config.attack_restarts, seed)
    record = {"index": sample.index, "label": sample.label, "size": int((~free).sum()),
              "size_min": int(necessary.sum()), "seconds": seconds, "attack_seconds": time.perf_counter() - clock}
    record["dist_to_minimal"] = record["size"] - record["size_min"]
    record["explanation"] = (~free).nonzero().flatten().tolist()
    record.update(details)
    if config.verify == "exact":
        verdict = exact_check(net, sample.x0, sample.lower, sample.upper, free, sample.label, config.exact_time_limit)
        record["verified"] = verdict.robust
    if refine == "exact":
        clock = time.perf_counter()
        refined, refuted, unknown = exact_refinement(net, sample, free, necessary, config.exact_time_limit)
        record.update(refined_size=int((~refined).sum()), refine_seconds=time.perf_counter() - clock,
                      refined_size_min=int(necessary.sum()) + refuted, refined_dist_to_minimal=unknown,
                      refined_explanation=(~refined).nonzero().flatten().tolist())
    return record


def exact_refinement(net: AffineNet, sample: Sample, free: torch.Tensor, necessary: torch.Tensor,
                     time_limit: float) -> tuple[torch.Tensor, int, int]:
    """VeriX-style pass with the MILP over the undecided pixels (kept, not proven necessary): each is freed when
    the MILP proves it, or proven necessary by the MILP's counterexample. Returns (free, refuted, unknown); with no
    unknown the result is a subset-minimal explanation (every kept pixel is necessary)."""
    free = free.clone()
    refuted = unknown = 0
    for pixel in (~free & ~necessary).nonzero().flatten().tolist():
        trial = free.clone()
        trial[pixel] = True
        verdict = exact_check(net, sample.x0, sample.lower, sample.upper, trial, sample.label, time_limit).robust
        if verdict is True:
            free = trial
        else:
            refuted += verdict is False
            unknown += verdict is None
    return free, refuted, unknown


def summarise(records: list[dict], skipped: dict, method: str) -> dict:
    def mean(key):
        values = [r[key] for r in records if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    metrics = {"method": method, "n_explained": len(records), "skipped_misclassified": skipped["misclassified"],
               "skipped_robust": skipped["robust"], "mean_size": mean("size"), "mean_seconds": mean("seconds"),
               "mean_size_min": mean("size_min"), "mean_dist_to_minimal": mean("dist_to_minimal"),
               "mean_attack_seconds": mean("attack_seconds")}
    if "refined_size" in records[0]:
        metrics.update(mean_refined_size=mean("refined_size"), mean_refine_seconds=mean("refine_seconds"),
                       mean_refined_size_min=mean("refined_size_min"),
                       mean_refined_dist_to_minimal=mean("refined_dist_to_minimal"))
    if "verified" in records[0]:
        metrics["verified_fraction"] = sum(r["verified"] is True for r in records) / len(records)
        metrics["refuted"] = sum(r["verified"] is False for r in records)
    return metrics


def pixel_mask(net: AffineNet, explanation: list[int]) -> list:
    mask = torch.zeros(net.n_features, dtype=torch.int64)
    mask[explanation] = 1
    return mask.reshape(net.input_shape[1:]).tolist() if len(net.input_shape) == 3 else mask.tolist()


def write_explanations(ctx, net: AffineNet, method: str, records: list[dict], epsilon: float) -> None:
    rows = [{**r, "mask": pixel_mask(net, r["explanation"])} for r in records]
    payload = {"method": method, "epsilon": epsilon, "input_shape": list(net.input_shape),
               "note": "explanation/mask: kept pixels (fixed at their value); every other pixel may move by epsilon",
               "samples": rows}
    head = json.dumps({k: v for k, v in payload.items() if k != "samples"}, indent=1)[:-2]
    lines = ",\n  ".join(json.dumps(row) for row in rows)  # one sample per line keeps the file readable
    ctx.path("explanations.json").write_text(f'{head},\n "samples": [\n  {lines}\n ]\n}}\n')


def draw_overlays(path: Path, net: AffineNet, images: torch.Tensor, records: list[dict]) -> None:
    """Each image in gray with its explanation pixels tinted red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(net.input_shape) != 3:
        return
    channels, height, width = net.input_shape
    cols = min(8, len(records))
    rows = (len(records) + cols - 1) // cols
    figure, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows), squeeze=False)
    for axis in axes.flat:
        axis.axis("off")
    for axis, record in zip(axes.flat, records):
        gray = images[record["index"]].reshape(channels, height, width).mean(0)
        rgb = gray[..., None].expand(height, width, 3).clone()
        mask = torch.tensor(pixel_mask(net, record["explanation"]), dtype=torch.bool)
        rgb[mask] = 0.45 * rgb[mask] + 0.55 * torch.tensor([1.0, 0.1, 0.1], dtype=rgb.dtype)
        axis.imshow(rgb.numpy(), interpolation="nearest")
        axis.set_title(f"#{record['index']} c={record['label']} |E|={record['size']}", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
