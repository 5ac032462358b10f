"""`iclrkit cluster khc generate|solve` end to end, --dry-run, --heuristic-only, and bad input (exit 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("khc") / "inst"
    result = CliRunner().invoke(app, ["cluster", "khc", "generate", "-n", "12", "--dim", "2", "-k", "2",
                                      "--seed", "3", "--noise", "0.005", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    return out


def test_generate_writes_points_and_planted_planes(planted):
    points = np.loadtxt(planted / "points.csv", delimiter=",", skiprows=1)
    truth = json.loads((planted / "planted.json").read_text())
    assert points.shape == (12, 2)
    assert len(truth["labels"]) == 12 and len(truth["hyperplanes"]) == 2
    assert json.loads((planted / "run.json").read_text())["status"] == "ok"


def test_solve_end_to_end(cli, planted, tmp_path):
    out = tmp_path / "solved"
    r = cli(["cluster", "khc", "solve", "-d", planted / "points.csv", "-k", "2", "--formulation", "multi",
             "--time-limit", "60", "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["metrics"]["status"] == "optimal"
    assert record["metrics"]["heuristic_objective"] >= record["metrics"]["objective"] - 1e-12
    solution = json.loads((out / "solution.json").read_text())
    assert len(solution["labels"]) == 12 and len(solution["hyperplanes"]) == 2
    for plane in solution["hyperplanes"]:
        assert np.linalg.norm(plane["w"]) == pytest.approx(1.0)
    assert (out / "plot.png").stat().st_size > 1000
    assert np.loadtxt(out / "assignments.csv", skiprows=1).shape == (12,)
    assert {"solution.json", "assignments.csv", "plot.png"} <= set(record["artifacts"])


def test_heuristic_only_and_npy_input(cli, planted, tmp_path):
    npy = tmp_path / "points.npy"
    np.save(npy, np.loadtxt(planted / "points.csv", delimiter=",", skiprows=1))
    r = cli(["cluster", "khc", "solve", "-d", npy, "-k", "2", "--heuristic-only", "--no-plot",
             "--out", tmp_path / "h", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["status"] == "heuristic"
    assert not (tmp_path / "h" / "plot.png").exists()


def test_tighten_flag_reaches_the_model(cli, planted):
    r = cli(["cluster", "khc", "solve", "-d", planted / "points.csv", "-k", "2", "--tighten", "--dry-run"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["model"]["convex_quadratic_constraints"] == 1 + 2  # epigraph + 2 balls


def test_dry_run_prints_model_size(cli, planted):
    r = cli(["cluster", "khc", "solve", "-d", planted / "points.csv", "-k", "2", "--formulation", "inf",
             "--dry-run"])
    assert r.exit_code == 0, r.stderr
    model = json.loads(r.stdout)["plan"]["model"]
    assert model["binary_vars"] == 12 * 2 + 2 * 2 and model["nonconvex_quadratic_constraints"] == 2


def _csv(path, rows):
    path.write_text("x,y\n" + "\n".join(",".join(str(v) for v in row) for row in rows) + "\n")
    return path


@pytest.mark.parametrize("case,k,message", [
    ("missing", 2, "not found"),
    ("nan", 2, "NaN"),
    ("constant", 2, "identical"),
    ("one_column", 2, "d = 1"),
    ("text", 2, "not numeric"),
    ("ok", 0, "greater than or equal to 1"),
    ("ok", 50, "exceeds the number of points"),
    ("ok_bad_time", 2, "time_limit"),
])
def test_bad_input_exits_2(cli, tmp_path, case, k, message):
    rng = np.random.default_rng(0)
    files = {
        "missing": lambda: tmp_path / "nope.csv",
        "nan": lambda: _csv(tmp_path / "nan.csv", [[1, 2], [3, "nan"], [0, 1], [2, 2]]),
        "constant": lambda: _csv(tmp_path / "c.csv", [[1, 1]] * 5),
        "one_column": lambda: _csv(tmp_path / "one.csv", rng.normal(size=(6, 1)).tolist()),
        "text": lambda: _csv(tmp_path / "t.csv", [[1, 2], ["a", "b"]]),
        "ok": lambda: _csv(tmp_path / "ok.csv", rng.normal(size=(8, 2)).tolist()),
    }
    files["ok_bad_time"] = files["ok"]
    out = tmp_path / "out"
    extra = ["--time-limit", "0"] if case == "ok_bad_time" else []
    r = cli(["cluster", "khc", "solve", "-d", files[case](), "-k", str(k), "--out", out, *extra])
    assert r.exit_code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
