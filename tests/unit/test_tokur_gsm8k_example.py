"""examples/tokur/gsm8k.py --score-only records the run's own sampling settings, not the invocation's defaults."""

import argparse
import json
from pathlib import Path

from testkit import load_script

HERE = Path(__file__).resolve().parents[2] / "examples" / "tokur" / "gsm8k.py"


def _load():
    return load_script(HERE, "tokur_gsm8k_example")


def test_score_only_takes_the_runs_settings(tmp_path):
    example = _load()
    defaults = argparse.Namespace(temperature=1.0, max_new_tokens=128, candidates=4)
    assert example.run_settings(tmp_path, defaults) == (1.0, 128, 4)  # nothing recorded: the command line's
    (tmp_path / "config.yaml").write_text("temperature: 0.3\ngenerate_batch: 16\n")
    assert example.run_settings(tmp_path, defaults) == (0.3, 128, 4)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text(json.dumps({"config": {"max_new_tokens": 96, "candidates": 3}}))
    assert example.run_settings(tmp_path, defaults) == (0.3, 96, 3)
