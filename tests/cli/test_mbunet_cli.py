"""`iclrkit segment mbunet train | convert | infer | bench` end to end on a tiny U-Net, and bad input."""

import json
from pathlib import Path

import pytest

TINY = ["--set", "n_images=10", "--size", "32", "--width", "8", "--set", "depth=2", "--steps", "6",
        "--set", "probe_images=2", "--set", "batch_size=4"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("mb") / "train"
    result = CliRunner().invoke(app, ["segment", "mbunet", "train", "--data", "procedural", "--variant", "masked",
                                      *TINY, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return out


def test_train_convert_infer_bench(cli, trained, tmp_path, device_args, test_device):
    run = json.loads((trained / "run.json").read_text())
    assert run["status"] == "ok" and run["metrics"]["variant"] == "masked"
    assert 0 <= run["metrics"]["miou"] <= 100 and "mask_ratios" in run["metrics"]
    assert (trained / "model.safetensors").is_file()
    search = json.loads((trained / "mask_search.json").read_text())
    assert search["search"] == "cost" and search["chosen"] == run["metrics"]["mask_ratios"]
    assert set(run["metrics"]["zero_fraction"]) == {n for n, r in search["chosen"].items() if r > 0}

    packed = tmp_path / "packed"
    r = cli(["segment", "mbunet", "convert", "--model", trained, "--out", packed, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["exact"] is True and metrics["max_abs_logit_diff"] == 0.0
    assert metrics["compression"] > 4

    pred = tmp_path / "pred"
    r = cli(["segment", "mbunet", "infer", "--model", packed, "--data", "procedural", "--limit", "3", "--out", pred,
             *device_args, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["backend"] == f"packed-{test_device.split(':')[0]}" and metrics["images"] == 3 and "miou" in metrics
    assert len(list((pred / "masks").glob("*.png"))) == 3 and len(list((pred / "overlays").glob("*.png"))) == 3

    r = cli(["segment", "mbunet", "bench", "--model", packed, "--size", "32", "--repeats", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["fp32_ms"] > 0 and metrics["packed_ms"] > 0 and metrics["shape"] == "1x3x32x32"


def test_infer_on_a_folder_writes_masks(cli, trained, tmp_path):
    import numpy as np
    from PIL import Image

    (tmp_path / "photos" / "images").mkdir(parents=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
        tmp_path / "photos" / "images" / "a.png")
    r = cli(["segment", "mbunet", "infer", "--model", trained, "--data", tmp_path / "photos", "--out",
             tmp_path / "out", "--json"])
    assert r.exit_code == 0, r.stderr
    assert "miou" not in json.loads(r.stdout)["metrics"]
    mask = np.asarray(Image.open(tmp_path / "out" / "masks" / "00000.png"))
    assert mask.shape == (32, 32) and mask.max() < 4


NOT_A_MODEL = str(Path(__file__).resolve().parent)  # an existing folder that holds no MBU-Net


@pytest.mark.parametrize("args, needle", [
    (["train", "--data", "/nonexistent/folder"], "not found"),
    (["train", "--variant", "ternary"], "variant"),
    (["train", "--steps", "0"], "steps"),
    (["train", "--set", "mask_candidates=[1.5]"], "mask ratios"),
    (["train", "--set", "mask_rule=threshold", "--set", "mask_ratio=4"], "TWN threshold"),
    (["train", "--set", "mask_search=random"], "mask_search"),
    (["train", "--size", "30"], "multiple"),
    (["train", "--set", "bogus=1"], "unknown config key"),
    (["convert", "--model", "/nonexistent"], "model path not found"),
    (["infer", "--model", "/nonexistent"], "model path not found"),
    (["bench", "--model", "/nonexistent"], "model path not found"),
    (["convert", "--model", NOT_A_MODEL], "not a trained MBU-Net"),
    (["infer", "--model", NOT_A_MODEL], "not an MBU-Net"),
    (["bench", "--model", NOT_A_MODEL], "not an MBU-Net"),
])
def test_bad_input_exits_2_and_writes_nothing(cli, tmp_path, args, needle):
    out = tmp_path / "out"
    r = cli(["segment", "mbunet", *args, "--out", out])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and not out.exists()


def test_train_folder_without_masks_is_bad_input(cli, tmp_path):
    import numpy as np
    from PIL import Image

    (tmp_path / "d" / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / "d" / "images" / "x.png")
    r = cli(["segment", "mbunet", "train", "--data", tmp_path / "d", "--out", tmp_path / "o"])
    assert r.exit_code == 2 and "no masks" in r.stderr


def test_convert_refuses_fp32(cli, tmp_path):
    r = cli(["segment", "mbunet", "train", "--variant", "fp32", *TINY, "--steps", "1", "--out", tmp_path / "fp"])
    assert r.exit_code == 0, r.stderr
    r = cli(["segment", "mbunet", "convert", "--model", tmp_path / "fp", "--out", tmp_path / "p"])
    assert r.exit_code == 2 and "fp32" in r.stderr


def test_probe_search_records_measured_gains(cli, tmp_path):
    r = cli(["segment", "mbunet", "train", *TINY, "--steps", "2", "--set", "mask_search=probe", "--out",
             tmp_path / "p"])
    assert r.exit_code == 0, r.stderr
    search = json.loads((tmp_path / "p" / "mask_search.json").read_text())
    assert search["search"] == "probe" and set(search["gains"]) == set(search["bitops"])


def test_dry_run_prints_plan(cli, tmp_path):
    r = cli(["segment", "mbunet", "train", "--dry-run", "--variant", "binary"])
    assert r.exit_code == 0 and json.loads(r.stdout)["config"]["variant"] == "binary"
