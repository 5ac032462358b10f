"""`iclrkit prompt mhlp` end to end through the loopback server, and bad input."""

import json

import pytest

from toolkit.llm.server import LoopbackServer


@pytest.fixture()
def qa_file(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"question": f"Is {n} even?", "answer": "yes" if n % 2 == 0 else "no"} for n in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def hf_server(tiny_llama_dir):
    from toolkit.llm.hf import HFBackend

    with LoopbackServer(backend=HFBackend(str(tiny_llama_dir))) as url:
        yield url


def test_mhlp_end_to_end_over_loopback(cli, hf_server, tiny_llama_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    r = cli(["prompt", "mhlp", "--task-model", f"openai:tiny@{hf_server}", "--proposer-model", tiny_llama_dir,
             "-d", qa_file, "--steps", "4", "--burn-in", "1", "--thinning", "1", "--eval-size", "3",
             "--train-size", "4", "--set", "max_response_tokens=8", "--set", "max_prompt_tokens=8",
             "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["n_samples"] == 4 and metrics["n_eval"] == 3
    methods = {row["method"]: row for row in metrics["rows"]}
    assert set(methods) == {"mhlp", "single", "initial"} and 0 <= methods["mhlp"]["ece"] <= 1
    assert all(0 <= row["format_rate"] <= 1 for row in methods.values())
    steps = [json.loads(line) for line in (out / "chain.jsonl").read_text().splitlines()]
    assert len(steps) == 4 and all("log_q_reverse" in s for s in steps)
    assert len(json.loads((out / "samples.json").read_text())) == 4
    accuracies = json.loads((out / "prompt_accuracy.json").read_text())
    assert accuracies[0]["prompt"] == "You are a helpful assistant. Think step by step."


def test_mhlp_class_word_scoring_end_to_end(cli, tiny_llama_dir, qa_file, tmp_path):
    out = tmp_path / "run"
    r = cli(["prompt", "mhlp", "--task-model", tiny_llama_dir, "--proposer-model", tiny_llama_dir, "-d", qa_file,
             "--steps", "2", "--burn-in", "0", "--thinning", "1", "--eval-size", "3", "--train-size", "4", "--predictive", "score",
             "--set", "max_response_tokens=4", "--set", "max_prompt_tokens=4", "-o", out, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["n_samples"] == 3 and {row["method"] for row in metrics["rows"]} == {"mhlp", "single", "initial"}
    assert all(0 <= row["ece"] <= 1 and 0 <= row["brier"] <= 2 for row in metrics["rows"])
    selection = json.loads((out / "prompt_accuracy.json").read_text())
    assert all("train_gold_logprob" in s for s in selection)


def test_bad_predictive_choice(cli, tiny_llama_dir, qa_file, tmp_path):
    r = cli(["prompt", "mhlp", "--task-model", tiny_llama_dir, "--proposer-model", tiny_llama_dir, "-d", qa_file,
             "--predictive", "vote", "-o", tmp_path / "o"])
    assert r.exit_code == 2 and "'predictive'" in r.stderr and "sample" in r.stderr  # the bad flag, not another error
    assert not (tmp_path / "o").exists()


def test_chat_scoring_needs_a_local_model(cli, hf_server, qa_file, tmp_path):
    spec = f"openai:tiny@{hf_server}"
    r = cli(["prompt", "mhlp", "--task-model", spec, "--proposer-model", spec, "-d", qa_file, "--chat",
             "-o", tmp_path / "o"])
    assert r.exit_code == 3 and "chat score" in r.stderr


def test_backend_without_logprobs_names_the_capability(cli, qa_file, tmp_path):
    with LoopbackServer(reply=lambda prompt: "Answer: yes") as url:
        spec = f"openai:scripted@{url}"
        r = cli(["prompt", "mhlp", "--task-model", spec, "--proposer-model", spec, "-d", qa_file,
                 "-o", tmp_path / "o"])
    assert r.exit_code == 3
    assert "cannot score supplied text" in r.stderr and "'score'" in r.stderr


@pytest.mark.parametrize("content, message", [("", "no records"), ('{"question": "q", "answer": "a"}\n', "at least 2"), ("{bad json\n", ":1: malformed"),
                                               ('{"question": "q"}\n{"question": "r"}\n', "answer")])
def test_bad_data(cli, tiny_llama_dir, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    r = cli(["prompt", "mhlp", "--task-model", tiny_llama_dir, "--proposer-model", tiny_llama_dir, "-d", path,
             "-o", tmp_path / "o"])
    assert r.exit_code == 2 and message in r.stderr


def test_out_of_range_knob(cli, tiny_llama_dir, qa_file, tmp_path):
    r = cli(["prompt", "mhlp", "--task-model", tiny_llama_dir, "--proposer-model", tiny_llama_dir, "-d", qa_file,
             "--thinning", "0", "-o", tmp_path / "o"])
    assert r.exit_code == 2 and "thinning" in r.stderr  # the bad knob, not another error
    assert not (tmp_path / "o").exists()


def test_concurrency_is_a_config_key(cli, qa_file, tmp_path):
    spec = "openai:m@http://127.0.0.1:9/v1"
    config = tmp_path / "mhlp.yaml"
    config.write_text("concurrency: 4\nsteps: 3\n")
    r = cli(["prompt", "mhlp", "--task-model", spec, "--proposer-model", spec, "-d", qa_file, "--config", config,
             "--dry-run"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["config"]["concurrency"] == 4
    r = cli(["prompt", "mhlp", "--task-model", spec, "--proposer-model", spec, "-d", qa_file, "--config", config,
             "--set", "concurrency=0", "-o", tmp_path / "o"])
    assert r.exit_code == 2 and "concurrency" in r.stderr and not (tmp_path / "o").exists()


def test_server_refusing_echo_logprobs_is_one_line_exit_3_and_nothing_written(cli, qa_file, tmp_path):
    """#31 bad input "a server that refuses log-probs": llama.cpp's "Only no echo is supported" becomes one line
    naming the limitation, exit 3, before anything is sampled or written."""
    with LoopbackServer(reply=lambda prompt: "yes", refuse_echo=True) as url:
        spec = f"openai:llamacpp@{url}"
        out = tmp_path / "o"
        r = cli(["prompt", "mhlp", "--task-model", spec, "--proposer-model", spec, "-d", qa_file, "--steps", "2",
                 "-o", out])
    assert r.exit_code == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot score supplied text" in lines[0] and "llama.cpp" in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob("o.partial*"))
