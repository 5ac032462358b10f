"""`iclrkit explain fame|verix` end to end on a tiny saved network, ONNX and zoo:digits-mlp; bad input."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from toolkit.explain.net import save_net

LAYERS = [{"type": "flatten"}, {"type": "linear", "in": 9, "out": 6}, {"type": "relu"},
          {"type": "linear", "in": 6, "out": 3}]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def tiny_model(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(9, 6), nn.ReLU(), nn.Linear(6, 3))
    for parameter in model.parameters():
        if parameter.dim() == 2:
            nn.init.normal_(parameter, std=1.5)
    save_net(model, LAYERS, (1, 3, 3), tmp_path / "net")
    return tmp_path / "net", model


@pytest.fixture()
def images(tmp_path):
    path = tmp_path / "images.npz"
    np.savez(path, x=np.random.default_rng(0).random((12, 1, 3, 3)))
    return path


def test_fame_end_to_end_verified(cli, tiny_model, images, tmp_path):
    out = tmp_path / "fame"
    r = cli(["explain", "fame", "-m", tiny_model[0], "-d", images, "--epsilon", "0.3", "-n", "4", "--verify",
             "exact", "--refine", "exact", "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    metrics = record["metrics"]
    assert record["technique"] == "explain.fame" and metrics["verified_fraction"] == 1.0
    assert metrics["mean_size_min"] <= metrics["mean_refined_size"] <= metrics["mean_size"]
    assert metrics["mean_refined_dist_to_minimal"] == 0  # every kept pixel proven necessary after the MILP pass
    explained = json.loads((out / "explanations.json").read_text())
    assert len(explained["samples"]) == metrics["n_explained"]
    for sample in explained["samples"]:
        assert sum(map(sum, sample["mask"])) == sample["size"] == len(sample["explanation"])
        assert sum(sample["freed_per_round"]) + sample["freed_by_singleton_phase"] == 9 - sample["size"]
    assert (out / "overlays.png").stat().st_size > 0 and (out / "run.json").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_verix_end_to_end_and_onnx(cli, tiny_model, images, tmp_path):
    onnx_path = tmp_path / "net.onnx"
    torch.onnx.export(tiny_model[1].eval(), (torch.zeros(1, 1, 3, 3),), str(onnx_path), dynamo=False)
    sizes = {}
    for name, model in (("folder", tiny_model[0]), ("onnx", onnx_path)):
        out = tmp_path / f"verix-{name}"
        r = cli(["explain", "verix", "-m", model, "-d", images, "--epsilon", "0.3", "-n", "3", "--verify", "exact",
                 "--out", out, "--json"])
        assert r.exit_code == 0, r.stderr
        sizes[name] = json.loads(r.stdout)["metrics"]
        assert sizes[name]["verified_fraction"] == 1.0
    assert sizes["folder"]["mean_size"] == sizes["onnx"]["mean_size"]


def test_zoo_digits_mlp(cli, tmp_path):
    r = cli(["explain", "fame", "-m", "zoo:digits-mlp", "-n", "2", "--set", "attack=fgsm", "--out", tmp_path / "z",
             "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["n_explained"] == 2


def test_dry_run_writes_nothing(cli, tiny_model, tmp_path):
    r = cli(["explain", "fame", "-m", tiny_model[0], "--dry-run", "--out", tmp_path / "dry"])
    assert r.exit_code == 0 and not (tmp_path / "dry").exists()
    assert json.loads(r.stdout)["config"]["epsilon"] == 0.05


@pytest.mark.parametrize("case", ["missing-model", "bad-json", "nan-images", "range", "shape", "epsilon",
                                  "knapsack", "not-onnx", "bad-layer"])
def test_bad_input_exit_2(cli, tiny_model, images, tmp_path, case):
    model, data, extra = str(tiny_model[0]), str(images), []
    if case == "missing-model":
        model = str(tmp_path / "nope")
    elif case == "bad-json":
        (tiny_model[0] / "config.json").write_text("{not json")
    elif case == "nan-images":
        bad = np.random.default_rng(0).random((3, 1, 3, 3))
        bad[0, 0, 0, 0] = np.nan
        np.savez(tmp_path / "nan.npz", x=bad)
        data = str(tmp_path / "nan.npz")
    elif case == "range":
        np.save(tmp_path / "big.npy", np.full((3, 9), 255.0))
        data = str(tmp_path / "big.npy")
    elif case == "shape":
        np.save(tmp_path / "shape.npy", np.zeros((3, 10)))
        data = str(tmp_path / "shape.npy")
    elif case == "epsilon":
        extra = ["--epsilon", "-0.1"]
    elif case == "knapsack":
        extra = ["--knapsack", "best"]
    elif case == "not-onnx":
        (tmp_path / "model.pt").write_text("x")
        model = str(tmp_path / "model.pt")
    elif case == "bad-layer":
        spec = json.loads((tiny_model[0] / "config.json").read_text())
        spec["layers"][2] = {"type": "sigmoid"}
        (tiny_model[0] / "config.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    r = cli(["explain", "fame", "-m", model, "-d", data, "--out", out, *extra])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
