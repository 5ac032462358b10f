"""`iclrkit explain cave|consistency` end to end on a tiny synthetic set; bad input exits 2 with one line."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "n_classes=2", "--set", "n_train_per_class=6", "--set", "n_test_per_class=3", "--set",
        "image_size=32", "--set", "n_vertices=40", "--set", "baseline_epochs=1", "--set", "clutter_queue=32",
        "--concepts", "3", "--epochs", "1"]


@pytest.fixture(scope="module")
def cave_run(tmp_path_factory):
    pytest.importorskip("open3d")
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("cave") / "run"
    result = CliRunner().invoke(app, ["explain", "cave", *TINY, "--out", str(out), "--json"])
    return result, out


def test_cave_end_to_end_writes_rows_attributions_and_figures(cave_run):
    result, out = cave_run
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["technique"] == "explain.cave"
    rows = {row["method"]: row for row in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"CAVE", "2D CNN + NMF concepts (CRAFT-lite)", "2D CNN + Grad-CAM"}
    for row in rows.values():
        assert {"acc_iid", "acc_occlusion", "acc_texture", "acc_noise", "consistency_3d"} <= set(row)
        assert 0 <= row["acc_iid"] <= 1
        assert row["consistency_3d"] is None or 0 <= row["consistency_3d"] <= 1  # None: no concept fired twice
    assert rows["2D CNN + Grad-CAM"]["consistency_3d"] is not None
    maps = np.load(out / "attributions_cave.npz")["maps"]
    assert maps.shape == (6, 3, 32, 32) and (maps >= 0).all()
    for name in ("dataset.npz", "cave.safetensors", "concept_maps.png", "concepts_on_mesh_cave.png", "run.json"):
        assert (out / name).stat().st_size > 0, name


def test_consistency_command_reproduces_the_cave_score(cli, cave_run, tmp_path):
    _, out = cave_run
    r = cli(["explain", "consistency", "-d", out / "dataset.npz", "-a", out / "attributions_cave.npz",
             "--out", tmp_path / "c", "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    cave_row = json.loads((out / "results.json").read_text())["rows"][0]
    expected = cave_row["consistency_3d"]
    assert metrics["consistency_3d"] == (None if expected is None else pytest.approx(expected, abs=1e-6))
    assert json.loads((tmp_path / "c" / "consistency.json").read_text())["method"] == "CAVE"


def test_consistency_bad_inputs_exit_2(cli, cave_run, tmp_path):
    _, out = cave_run
    missing = cli(["explain", "consistency", "-d", tmp_path / "nope.npz", "-a", out / "attributions_cave.npz"])
    assert missing.exit_code == 2 and "not found" in missing.stderr
    bad = tmp_path / "bad.npz"
    np.savez(bad, maps=np.full((1, 1, 32, 32), np.nan), index=np.array([0]))
    nan = cli(["explain", "consistency", "-d", out / "dataset.npz", "-a", bad])
    assert nan.exit_code == 2 and "NaN" in nan.stderr
    np.savez(bad, maps=np.ones((1, 1, 32, 32)), index=np.array([10 ** 6]))
    out_of_range = cli(["explain", "consistency", "-d", out / "dataset.npz", "-a", bad])
    assert out_of_range.exit_code == 2 and "out of range" in out_of_range.stderr


def test_cave_bad_inputs_exit_2(cli, tmp_path):
    empty = tmp_path / "empty.npz"
    np.savez(empty, labels=np.zeros(0))
    r = cli(["explain", "cave", "-d", empty, "--out", tmp_path / "o1"])
    assert r.exit_code == 2 and "lacks" in r.stderr and not (tmp_path / "o1").exists()
    r = cli(["explain", "cave", "--set", "occlusion_fraction=1.5", "--out", tmp_path / "o2"])
    assert r.exit_code == 2 and "occlusion_fraction" in r.stderr
    r = cli(["explain", "cave", "--classifier", "nope", "--out", tmp_path / "o3"])
    assert r.exit_code == 2
    r = cli(["explain", "cave", "-d", f"pascal3d:{tmp_path / 'nowhere'}", "--out", tmp_path / "o4"])
    assert r.exit_code == 2 and "root not found" in r.stderr
    r = cli(["explain", "cave", "--set", "relevance_sigma_px=-1", "--out", tmp_path / "o5"])
    assert r.exit_code == 2 and "relevance_sigma_px" in r.stderr
    r = cli(["explain", "cave", "--dry-run"])
    assert r.exit_code == 0 and "results.json" in r.stdout
