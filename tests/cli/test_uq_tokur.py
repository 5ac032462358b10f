"""`iclrkit uq tokur` end to end on a tiny GPT-2, and bad input."""

import json

import pytest


@pytest.fixture()
def gsm_file(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"What is {a} plus {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"} for a in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tokur_end_to_end(cli, tiny_gpt2_dir, gsm_file, tmp_path):
    out = tmp_path / "run"
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--candidates", "2", "--samples", "3",
             "--rank", "2", "--max-new-tokens", "4", "--set", "search_iterations=3", "--set", "anchor_size=2",
             "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    # the first anchor_size=2 records pick σ and are not evaluated: 1 question x 2 candidates
    assert metrics["n_responses"] == 2 and len(metrics["sigma_search"]) == 3 and metrics["sigma"] >= 0
    assert {row["selection"] for row in metrics["rows"]} == {"tokur", "random", "first", "oracle", "majority",
                                                             "tokur-total", "tokur-aleatoric"}
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {rec["question"] for rec in records} == {0}
    for rec in records:
        assert rec["epistemic"] >= 0 and rec["total"] == pytest.approx(rec["aleatoric"] + rec["epistemic"])


def test_sigma_zero_has_no_epistemic(cli, tiny_gpt2_dir, gsm_file, tmp_path):
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--candidates", "1", "--samples", "3",
             "--sigma", "0", "--max-new-tokens", "3", "--limit", "2", "-o", tmp_path / "o"])
    assert r.exit_code == 0, r.stderr
    records = [json.loads(line) for line in (tmp_path / "o" / "responses.jsonl").read_text().splitlines()]
    assert all(rec["epistemic"] == 0.0 for rec in records)


@pytest.mark.parametrize("content, message", [("", "no records"), ("{oops\n", ":1: malformed"),
                                               ('{"question": "q", "answer": "a worked\\nsolution"}\n',
                                                "no final answer"),
                                               ('{"prompt": "q", "answer": "1"}\n', "needs a question")])
def test_bad_data(cli, tiny_gpt2_dir, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", path, "-o", tmp_path / "o"])
    assert r.exit_code == 2 and message in r.stderr


@pytest.mark.parametrize("sigma", ["-1", "nan", "big"])
def test_bad_sigma(cli, tiny_gpt2_dir, gsm_file, tmp_path, sigma):
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--sigma", sigma, "-o", tmp_path / "o"])
    assert r.exit_code == 2 and "sigma" in r.stderr


def test_anchor_file_keeps_every_record_for_evaluation(cli, tiny_gpt2_dir, gsm_file, tmp_path):
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--candidates", "1", "--samples", "2",
             "--max-new-tokens", "2", "--set", "search_iterations=2", "--set", f"anchor_data={gsm_file}",
             "-o", tmp_path / "o", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["n_responses"] == 3
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--set", "anchor_size=3", "-o", tmp_path / "p"])
    assert r.exit_code == 2 and "anchor" in r.stderr


def test_math_style_records_are_read_and_judged(cli, tiny_gpt2_dir, tmp_path):
    """MATH / MetaMath records (\\boxed, bare LaTeX answers, "The answer is: …") no longer stop the reader."""
    path = tmp_path / "math.jsonl"
    rows = [{"problem": "Simplify p minus q.", "solution": "It is $\\boxed{p - q}$.", "answer": "p - q"},
            {"problem": "Convert (0, 3) to polar.", "solution": "So \\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}."},
            {"query": "What is 2 + 2?", "response": "2 + 2 = 4.\nThe answer is: 4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    r = cli(["uq", "tokur", "-m", tiny_gpt2_dir, "-d", path, "--candidates", "1", "--samples", "2", "--sigma", "0.01",
             "--max-new-tokens", "3", "-o", out])
    assert r.exit_code == 0, r.stderr
    records = [json.loads(line) for line in (out / "responses.jsonl").read_text().splitlines()]
    assert [rec["reference"] for rec in records] == ["p - q", "\\left( 3, \\frac{\\pi}{2} \\right)", "4"]


def test_judge_counts_reach_run_json_and_a_timed_out_judgement_is_wrong(cli, tiny_gpt2_dir, gsm_file, tmp_path,
                                                                         monkeypatch):
    """Every judgement is counted in metrics.judge; one past the judge's time limit is "not equal", counted, and
    warned about in run.json (here every judgement is made to time out)."""
    from toolkit.uq import math_answer

    args = ["uq", "tokur", "-m", tiny_gpt2_dir, "-d", gsm_file, "--candidates", "2", "--samples", "2", "--sigma",
            "0.01", "--max-new-tokens", "2", "--json"]
    r = cli(args + ["-o", tmp_path / "ok"])
    assert r.exit_code == 0, r.stderr
    judge = json.loads(r.stdout)["metrics"]["judge"]
    assert judge["judged"] >= 6 and judge["timeouts"] == 0

    math_answer._CACHE.clear()
    monkeypatch.setattr(math_answer._WORKER, "ask", lambda prediction, reference, timeout_s: None)
    monkeypatch.setattr(math_answer, "predicted_final", lambda text: "2")  # the right answer of the first question
    r = cli(args + ["-o", tmp_path / "slow"])
    assert r.exit_code == 0, r.stderr
    records = [json.loads(line) for line in (tmp_path / "slow" / "responses.jsonl").read_text().splitlines()]
    run = json.loads((tmp_path / "slow" / "run.json").read_text())
    assert not any(rec["correct"] for rec in records)
    assert run["metrics"]["judge"]["timeouts"] >= len(records) == 6
    assert any("time limit" in w for w in run["warnings"])
