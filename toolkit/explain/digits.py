"""scikit-learn's bundled 8x8 digits and the zoo recipes `digits-mlp` / `digits-cnn` trained on them.

`digits-mlp` mirrors the paper's MNIST-10x2 (two dense ReLU layers of 10 units); `digits-cnn` is
Conv(1->8, 3, pad 1)-ReLU-Conv(8->8, 3, stride 2, pad 1)-ReLU-Linear(128->10). Pixels are divided by 16 so inputs
lie in [0, 1]. The train/test split is fixed (25% test, stratified, seed 0) so every command sees the same images.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from toolkit.core.errors import BadInputError
from toolkit.explain.net import build_sequential, save_net

log = logging.getLogger("iclrkit")
INPUT_SHAPE = (1, 8, 8)
SPLIT_SEED = 0
TEST_FRACTION = 0.25
ARCHS = {
    "digits-mlp": [{"type": "flatten"}, {"type": "linear", "in": 64, "out": 10}, {"type": "relu"},
                   {"type": "linear", "in": 10, "out": 10}, {"type": "relu"}, {"type": "linear", "in": 10, "out": 10}],
    "digits-cnn": [{"type": "conv2d", "in": 1, "out": 8, "kernel": 3, "stride": 1, "padding": 1}, {"type": "relu"},
                   {"type": "conv2d", "in": 8, "out": 8, "kernel": 3, "stride": 2, "padding": 1}, {"type": "relu"},
                   {"type": "flatten"}, {"type": "linear", "in": 128, "out": 10}],
}


def digits_split(split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
    """(images (N, 1, 8, 8) in [0, 1], labels) of the fixed train or test split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if split not in ("train", "test"):
        raise BadInputError(f"unknown digits split '{split}'", "use digits, digits:test or digits:train")
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data / 16.0, digits.target, test_size=TEST_FRACTION,
                                                        stratify=digits.target, random_state=SPLIT_SEED)
    images, labels = (x_train, y_train) if split == "train" else (x_test, y_test)
    return torch.tensor(images, dtype=torch.float32).reshape(-1, *INPUT_SHAPE), torch.tensor(labels)


def train_classifier(name: str, steps: int, seed: int) -> tuple[torch.nn.Sequential, dict]:
    """Full-batch Adam on the train split; returns the model and its train/test accuracy."""
    torch.manual_seed(seed)
    model = build_sequential(ARCHS[name])
    x_train, y_train = digits_split("train")
    x_test, y_test = digits_split("test")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train), y_train)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        stats = {"train_accuracy": float((model(x_train).argmax(1) == y_train).float().mean()),
                 "test_accuracy": float((model(x_test).argmax(1) == y_test).float().mean()),
                 "final_loss": float(loss)}
    return model.eval(), stats


def _build(name: str, out: Path, data: str | None, steps: int | None, seed: int, quiet: bool) -> dict:
    if data not in (None, "", "embedded", "digits"):
        raise BadInputError(f"zoo:{name} trains on scikit-learn's bundled digits; --data is not supported")
    model, stats = train_classifier(name, steps or 400, seed)
    if not quiet:
        log.warning("zoo:%s test accuracy %.3f", name, stats["test_accuracy"])
    save_net(model, ARCHS[name], INPUT_SHAPE, out,
             metadata={"zoo": name, "data": "sklearn digits / 16 (train split, 25% test held out, seed 0)",
                       "seed": seed, "steps": steps or 400, "classes": 10, **stats})
    (Path(out) / "README.md").write_text(f"# zoo:{name}\n\nTrained here on scikit-learn's digits (8x8, /16): "
                                         f"test accuracy {stats['test_accuracy']:.3f}. Load with "
                                         "`toolkit.explain.net.load_net`.\n")
    return stats


def build_digits_mlp(out: Path, data: str | None = None, steps: int | None = None, seed: int = 0,
                     quiet: bool = False, **_) -> dict:
    return _build("digits-mlp", out, data, steps, seed, quiet)


def build_digits_cnn(out: Path, data: str | None = None, steps: int | None = None, seed: int = 0,
                     quiet: bool = False, **_) -> dict:
    return _build("digits-cnn", out, data, steps, seed, quiet)
