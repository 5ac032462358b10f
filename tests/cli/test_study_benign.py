"""`iclrkit study benign-overfit` end to end and bad input."""

import json


def test_grid_end_to_end(cli, tmp_path):
    out = tmp_path / "bo"
    r = cli(["study", "benign-overfit", "--n", "20", "--d", "200,400", "--mu", "2", "--steps", "300",
             "--set", "n_test=500", "--out", out])
    assert r.exit_code == 0, r.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["metrics"]["points"] == 2 and record["metrics"]["max_train_error"] == 0
    points = json.loads((out / "points.json").read_text())["points"]
    assert {p["d"] for p in points} == {200, 400}
    assert (out / "phase_diagram.png").stat().st_size > 0


def test_logistic_json(cli):
    r = cli(["study", "benign-overfit", "--n", "20", "--d", "100", "--mu", "3", "--steps", "200",
             "--loss", "logistic", "--set", "n_test=300", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["config"]["loss"] == "logistic"


def test_bad_input(cli, tmp_path):
    for args, message in ((["--d", "10,x"], "comma-separated"), (["--n", "1"], "greater than or equal to 2"),
                          (["--mu", "0"], "greater than 0"), (["--loss", "hinge"], "loss"),
                          (["--set", "noise=student_t", "--set", "dof=1.5"], "dof > 2")):
        r = cli(["study", "benign-overfit", *args, "--out", tmp_path / "o"])
        assert r.exit_code == 2, (args, r.stderr)
        assert message in r.stderr
        assert not (tmp_path / "o").exists()
