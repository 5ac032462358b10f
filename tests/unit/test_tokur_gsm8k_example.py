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


def test_score_rejudges_the_stored_responses(tmp_path):
    """Scoring re-reads every stored response and re-judges it with the current judge: a stale `correct` flag (here
    the old judge's false accept of 1000001 for 1000000) does not survive, and --strict-judge drops the last-number
    fallback."""
    example = _load()
    run = tmp_path / "run"
    run.mkdir()
    rows = [("So she has 1000001 now.", "1000000", True),  # stored by an older judge: wrong
            ("She has 7 apples and 12 pears", "12", False),  # last-number fallback: right, unmarked
            ("The answer is: 5", "5", True),
            ("The answer is: 4", "5", False)]
    records = [{"question": i // 2, "candidate": i % 2, "response": text, "final": None, "reference": reference,
                "correct": stored, "total": float(i), "aleatoric": float(i), "epistemic": float(i)}
               for i, (text, reference, stored) in enumerate(rows)]
    (run / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lenient = example.score(run, candidates=2)
    assert lenient["n_correct"] == 2 and lenient["answered"] == 4
    assert lenient["judge"]["judged"] >= 4 and lenient["judge"]["timeouts"] == 0
    strict = example.score(run, candidates=2, strict=True)
    assert strict["n_correct"] == 1 and strict["answered"] == 2
