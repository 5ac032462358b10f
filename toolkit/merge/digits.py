"""The merge zoo: small MLPs and CNNs on scikit-learn's bundled digits, trained in seconds on CPU.

Each zoo model is a backbone trained on all ten classes, then fine-tuned on a sub-task (a subset of classes); snapshots
along the fine-tuning trajectory give the weight VAE a dense set of checkpoints to learn from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from toolkit.merge.config import DigitsZooConfig
from toolkit.merge.models import PlainModel, save_plain

DIGITS = "sklearn-digits"


class DigitsMLP(nn.Module):
    """ReLU MLP: sizes [64, h1, ..., 10]; parameters named layers.<i>.weight / layers.<i>.bias."""

    def __init__(self, sizes: list[int]):
        super().__init__()
        self.sizes = list(sizes)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


class DigitsCNN(nn.Module):
    """`depth` 3x3 ReLU convolutions with `channels` channels on the 8x8 image, 2x2 average pooling, a linear head."""

    def __init__(self, channels: int, depth: int = 2):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(1 if i == 0 else channels, channels, 3, padding=1) for i in range(depth))
        self.head = nn.Linear(channels * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 8, 8)
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.head(nn.functional.avg_pool2d(x, 2).flatten(1))


FAMILIES = {"digits-mlp": lambda arch: DigitsMLP(arch["sizes"]),
            "digits-cnn": lambda arch: DigitsCNN(arch["channels"], arch["depth"])}


def net_from_state(family: str, arch: dict, state: dict[str, torch.Tensor]) -> nn.Module:
    net = FAMILIES[family](arch)
    net.load_state_dict(state)
    return net.eval()


@lru_cache(maxsize=1)
def digits_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): pixels / 16, a stratified 70/30 split with a fixed seed."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(digits.data / 16.0, digits.target, test_size=0.3,
                                              stratify=digits.target, random_state=0)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.long)  # noqa: E731
    return as_x(x_tr), as_y(y_tr), as_x(x_te), as_y(y_te)


def accuracy_on(net: nn.Module, classes: list[int] | None = None) -> float:
    """10-way test accuracy (percent) on the test samples whose label is in `classes` (all when None)."""
    _, _, x, y = digits_split()
    if classes is not None:
        keep = torch.isin(y, torch.tensor(classes))
        x, y = x[keep], y[keep]
    with torch.no_grad():
        return 100.0 * (net(x).argmax(-1) == y).float().mean().item()


def train(net: nn.Module, classes: list[int] | None, epochs: int, lr: float, seed: int, batch_size: int = 64,
          on_epoch=None) -> nn.Module:
    """Adam on the training samples of `classes` (all when None); `on_epoch(epoch, net)` after each epoch."""
    x, y, _, _ = digits_split()
    if classes is not None:
        keep = torch.isin(y, torch.tensor(classes))
        x, y = x[keep], y[keep]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start:start + batch_size]
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if on_epoch is not None:
            on_epoch(epoch, net)
    return net.eval()


@dataclass(frozen=True)
class ZooMember:
    """One family of the zoo: a backbone of width `width` from init `seed`, fine-tuned on each sub-task."""

    width: int
    seed: int
    kind: Literal["mlp", "cnn"] = "mlp"


def build_zoo(out: Path, members: list[ZooMember], tasks: dict[str, list[int]], depth: int = 2,
              backbone_epochs: int = 3, finetune_epochs: int = 6, lr: float = 1e-3, progress=None) -> list[dict]:
    """Train and save every backbone, fine-tune and snapshot; returns one record per saved model."""
    records = []
    for member in (progress or (lambda it, **_: it))(members, description="digits zoo"):
        torch.manual_seed(member.seed)
        family, arch = _architecture(member, depth)
        backbone = train(FAMILIES[family](arch), None, backbone_epochs, lr, seed=member.seed)
        stem = f"{'w' if member.kind == 'mlp' else 'c'}{member.width}-s{member.seed}"
        records.append(_save(out / f"{stem}-backbone", backbone, family, arch, list(range(10)), role="backbone"))
        for task_name, classes in tasks.items():
            fine = FAMILIES[family](arch)
            fine.load_state_dict(backbone.state_dict())

            def snapshot(epoch, net, task_name=task_name, classes=classes):
                if epoch + 1 < finetune_epochs:
                    records.append(_save(out / f"{stem}-{task_name}-ep{epoch + 1}", net.eval(), family, arch,
                                         classes, role="snapshot"))
                    net.train()

            train(fine, classes, finetune_epochs, lr, seed=member.seed + 1000, on_epoch=snapshot)
            records.append(_save(out / f"{stem}-{task_name}", fine, family, arch, classes, role="final"))
    return records


def _architecture(member: ZooMember, depth: int) -> tuple[str, dict]:
    if member.kind == "cnn":
        return "digits-cnn", {"channels": member.width, "depth": depth}
    return "digits-mlp", {"sizes": [64] + [member.width] * depth + [10]}


def _save(path: Path, net: nn.Module, family: str, arch: dict, classes: list[int], role: str) -> dict:
    model = PlainModel(family=family, arch=arch, state={k: v.detach().clone() for k, v in net.state_dict().items()},
                       task={"dataset": DIGITS, "classes": classes})
    save_plain(model, path, metadata={"role": role})
    return {"name": path.name, "width": arch.get("channels") or arch["sizes"][1], "classes": classes, "role": role,
            "acc_task": accuracy_on(net, classes), "acc_union": accuracy_on(net)}


def run_zoo(config: DigitsZooConfig, ctx) -> None:
    from toolkit.core.errors import require

    require(len(config.widths) == len(config.seeds), "widths and seeds need one entry per zoo member")
    require(all(0 <= c <= 9 for classes in config.tasks.values() for c in classes) and config.tasks,
            "tasks must map names to digit classes 0-9")
    members = [ZooMember(w, s, config.kind) for w, s in zip(config.widths, config.seeds)]
    records = build_zoo(ctx.path("models"), members, config.tasks, config.depth, config.backbone_epochs,
                        config.finetune_epochs, config.lr, progress=ctx.progress)
    ctx.path("zoo.json").write_text(json.dumps(records, indent=2))
    ctx.metrics["n_models"] = len(records)
    finals = [r for r in records if r["role"] != "snapshot"]
    ctx.metrics["models"] = {r["name"]: {"acc_task": r["acc_task"], "acc_union": r["acc_union"]}
                             for r in finals}
