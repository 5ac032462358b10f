"""`iclrkit study cot` end to end on a tiny KB, and bad input."""

import json

from testkit import assert_bad_inputs

TINY = ["--set", "n_entities=30", "--set", "n_relations=6", "--set", "out_degree=3", "--set", "ood_fraction=0.3",
        "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--set", "batch_size=32",
        "--set", "eval_every=10", "--set", "n_test=20"]


def test_end_to_end(cli, tmp_path):
    out = tmp_path / "cot"
    r = cli(["study", "cot", "--steps", "20", *TINY, "--out", out])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads((out / "run.json").read_text())["metrics"]
    for mode in ("cot", "nocot"):
        assert set(metrics[mode]) >= {"id_acc", "ood_acc", "bridge_layer"}
        assert 0 <= metrics[mode]["bridge_layer"] <= 2
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history["cot"]["history"]] == [10, 20]
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "logit_lens.png").stat().st_size > 0


def test_dry_run_plans_without_training(cli):
    r = cli(["study", "cot", "--dry-run", *TINY])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["plan"]["atomic"] == 90


def test_bad_input(cli, tmp_path):
    cases = ((["--set", "n_embd=30", "--set", "n_head=4"], "divisible"),
             (["--modes", "both"], "modes"),
             (["--set", "out_degree=9", "--set", "n_relations=8"], "out_degree"),
             (["--set", "n_entities=4", "--set", "n_relations=2", "--set", "out_degree=1",
               "--set", "ood_fraction=0.01"], "both hops OOD"),
             (["--label-noise", "1.5"], "label_noise"))
    assert_bad_inputs(cli, ["study", "cot", "--steps", "5"], cases, tmp_path / "o", out_flag="--out")
