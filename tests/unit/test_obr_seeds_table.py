"""examples/obr/seeds_table.py: per-seed rows, mean ± sd per (setting, method), and the "beyond the sd" verdict."""

import json
from pathlib import Path

from testkit import load_script

HERE = Path(__file__).resolve().parents[2] / "examples" / "obr" / "seeds_table.py"


def _load():
    return load_script(HERE, "obr_seeds_table")


def _write(out: Path, setting: str, method: str, seed: int, ppl: float):
    d = out / setting / f"{method}-s{seed}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"metrics": {"ppl": ppl, "compress_seconds": 10.0 + seed,
                                                        "rotated": "unrotated" not in method,
                                                        "sparsity": 0.5, "calibration_windows": 16, "seqlen": 256}}))


def test_mean_sd_and_verdicts(tmp_path, capsys):
    table = _load()
    for seed, (obr, base) in enumerate([(70.0, 80.0), (71.0, 81.0), (72.0, 82.0)]):
        _write(tmp_path, "w4a16-s50", "obr-gptq", seed, obr)
        _write(tmp_path, "w4a16-s50", "sparsegpt-two-stage", seed, base)
    for seed, plain in enumerate([75.0, 75.5]):
        _write(tmp_path, "w4a16-s50", "two-stage-unrotated", seed, plain)
    for seed, (obr, base) in enumerate([(70.0, 70.5), (74.0, 73.0)]):
        _write(tmp_path, "w4a4kv4-2-4", "obr-gptq", seed, obr)
        _write(tmp_path, "w4a4kv4-2-4", "sparsegpt-two-stage", seed, base)
    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps({"rows": [{"method": "kept"}]}))
    table.main(tmp_path, committed)
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    per_seed = [r for r in rows if r["seed"] != "mean"]
    assert len(per_seed) == 12 and all(isinstance(r["seed"], int) for r in per_seed)
    assert {r["method"] for r in per_seed} == {"OBR_GPTQ", "SparseGPT->GPTQ two-stage",
                                              "SparseGPT->GPTQ two-stage (unrotated)"}
    assert all(r["rotate"] == ("unrotated" not in r["method"]) for r in per_seed)
    summary = {(r["setting"], r["method"]): r for r in rows if r["seed"] == "mean"}
    assert summary[("w4a16-s50", "OBR_GPTQ")]["ppl_mean"] == 71.0
    assert summary[("w4a16-s50", "OBR_GPTQ")]["ppl_sd"] == 1.0
    assert summary[("w4a4kv4-2:4", "SparseGPT->GPTQ two-stage")]["n_seeds"] == 2
    printed = capsys.readouterr().out
    assert "w4a16-s50: OBR vs two-stage: OBR lower by 10.00 ppl; beyond the seed sd" in printed
    assert "w4a16-s50: OBR vs two-stage (unrotated): OBR lower by 4.25 ppl; beyond the seed sd" in printed
    assert "w4a4kv4-2:4: OBR vs two-stage: two-stage lower by 0.25 ppl; NOT beyond the seed sd" in printed
    assert "w4a4kv4-2:4: OBR vs two-stage (unrotated)" not in printed
    merged = json.loads(committed.read_text())
    assert merged["rows"] == [{"method": "kept"}] and len(merged["seed_rows"]) == len(rows)
