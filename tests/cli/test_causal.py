"""`iclrkit causal influence` end to end: run.json, artifacts, fitted mode, clear bad-input errors."""

import json

import pytest

GRAPH = """target: Y
desired: [1]
variables:
  - {name: U, role: latent}
  - {name: W, role: actionable}
  - {name: X, parents: [U, W], role: actionable}
  - {name: Z, role: actionable}
  - {name: Y, parents: [Z, U]}
"""


def test_example_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    r = cli(["causal", "influence", "--sem", "example:4", "--variable", "X", "--iterations", "500", "--out", out])
    assert r.exit_code == 0, r.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["metrics"]["X"]["inp"] == pytest.approx(-0.15)
    assert abs(record["metrics"]["X"]["inp_mcts"] + 0.15) <= 0.02
    assert (out / "influence.png").stat().st_size > 0
    rows = json.loads((out / "influence.json").read_text())["rows"]
    assert rows[0]["exact"]["decision"] == "observe"


def test_fitted_on_csv(cli, tmp_path):
    from toolkit.causal.influence import paper_examples, sample

    rows = sample(paper_examples()[1]["model"], 5000, seed=1)
    data = tmp_path / "obs.csv"
    data.write_text("U,W,X,Z,Y\n" + "\n".join(",".join(str(r[k]) for k in "UWXZY") for r in rows))
    (tmp_path / "g.yaml").write_text(GRAPH)
    r = cli(["causal", "influence", "--sem", tmp_path / "g.yaml", "--data", data, "--variable", "W",
             "--method", "exact", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["W"]["inp"] == pytest.approx(0.162, abs=0.05)


@pytest.mark.parametrize("graph,data,message", [
    (GRAPH.replace("parents: [Z, U]", "parents: [Z, Q]"), None, "unknown variable 'Q'"),
    (GRAPH.replace("{name: U, role: latent}", "{name: U, role: latent, parents: [Y]}"), None, "cyclic"),
    (GRAPH, "U,W,X,Z\n0,0,0,0\n", "no column"),
    (GRAPH, "U,W,X,Z,Y\n0,0,7,0,1\n", "not in its domain"),
    (GRAPH, "U,W,X,Z,Y\n", "no data rows"),
    ("variables: [", None, "malformed"),
])
def test_bad_input(cli, tmp_path, graph, data, message):
    (tmp_path / "g.yaml").write_text(graph)
    args = ["causal", "influence", "--sem", tmp_path / "g.yaml", "--out", tmp_path / "out"]
    if data is not None:
        (tmp_path / "d.csv").write_text(data)
        args += ["--data", tmp_path / "d.csv"]
    r = cli(args)
    assert r.exit_code == 2
    assert message in r.stderr
    assert not (tmp_path / "out").exists()


def test_bad_flags(cli, tmp_path):
    r = cli(["causal", "influence", "--sem", "example:2", "--variable", "Y"])
    assert r.exit_code == 2 and "is the target" in r.stderr
    r = cli(["causal", "influence", "--sem", "example:9"])
    assert r.exit_code == 2 and "unknown example" in r.stderr
    r = cli(["causal", "influence", "--sem", "example:2", "--given", "U"])
    assert r.exit_code == 2 and "NAME=VALUE" in r.stderr
    r = cli(["causal", "influence", "--sem", tmp_path / "missing.yaml"])
    assert r.exit_code == 2 and "not found" in r.stderr
