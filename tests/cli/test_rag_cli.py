import json

import pytest

from toolkit.llm.server import LoopbackServer
from toolkit.rag.synthetic import ScriptedPolicy, build_kb

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kb():
    return build_kb(films=6, people=5, cities=4, countries=2, seed=2)


@pytest.fixture()
def files(kb, tmp_path):
    corpus, qa = tmp_path / "corpus.jsonl", tmp_path / "qa.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in kb.corpus()))
    qa.write_text("\n".join(json.dumps(q) for q in kb.questions))
    return corpus, qa


def test_index_synth_train_run_end_to_end(cli, kb, files, tmp_path, tiny_gpt2_dir):
    corpus, qa = files
    r = cli(["rag", "deeprag", "index", "--corpus", corpus, "-o", tmp_path / "idx"])
    assert r.exit_code == 0, r.stderr
    with LoopbackServer(reply=ScriptedPolicy(kb)) as url:
        r = cli(["rag", "deeprag", "synth", "-m", f"openai:s@{url}", "-d", qa, "--index", tmp_path / "idx",
                 "-o", tmp_path / "synth", "--json"])
        assert r.exit_code == 0, r.stderr
        metrics = json.loads(r.stdout)["metrics"]
        assert metrics["found_rate"] == 1.0
        assert metrics["retrievals_per_path"] == pytest.approx(
            sum(q["unknown_hops"] for q in kb.questions) / len(kb.questions))
        r = cli(["rag", "deeprag", "synth", "-m", f"openai:s@{url}", "-d", qa, "--index", tmp_path / "idx",
                 "--set", "parametric_check=evidence", "-o", tmp_path / "synth-evidence", "--json"])
        assert r.exit_code == 0, r.stderr  # the script never guesses, so the checked search finds the same paths
        assert json.loads(r.stdout)["metrics"]["retrievals_per_path"] == metrics["retrievals_per_path"]
        r = cli(["rag", "deeprag", "run", "-m", f"openai:s@{url}", "-d", qa, "--index", tmp_path / "idx",
                 "--methods", "deeprag,always,never", "-o", tmp_path / "run", "--json"])
        assert r.exit_code == 0, r.stderr
    rows = {row["method"]: row for row in json.loads((tmp_path / "run" / "results.json").read_text())["rows"]}
    assert rows["deeprag"]["em"] == 1.0 == rows["always-retrieve"]["em"]
    assert rows["deeprag"]["retrievals_per_question"] < rows["always-retrieve"]["retrievals_per_question"]
    assert set(rows["deeprag"]) == {"dataset", "method", "em", "f1", "retrievals_per_question", "questions"}
    trace = json.loads((tmp_path / "run" / "traces-deeprag.jsonl").read_text().splitlines()[0])
    assert trace["final"] and trace["lines"]
    r = cli(["rag", "deeprag", "train", "-m", tiny_gpt2_dir, "-d", tmp_path / "synth", "-o", tmp_path / "model",
             "--set", "max_length=128", "--set", "dpo_epochs=1", "--set", "sft_lr=1e-3", "--set", "dpo_lr=1e-3",
             "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["sft_steps"] >= 1 and metrics["dpo_steps"] >= 1 and metrics["sft_loss_last"] < metrics["sft_loss_first"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "model" / "model")
    assert json.loads((tmp_path / "model" / "run.json").read_text())["status"] == "ok"


def test_synth_paper_defaults_gold_ablation_and_baseline_paths(cli, kb, files, tmp_path, tiny_gpt2_dir):
    corpus, qa = files
    assert cli(["rag", "deeprag", "index", "--corpus", corpus, "-o", tmp_path / "idx"]).exit_code == 0
    metrics = {}
    with LoopbackServer(reply=ScriptedPolicy(kb)) as url:
        for name, extra in {"paper": [], "gold": ["--decompose", "gold"], "always": ["--set", "policy=always"],
                            "never": ["--set", "policy=never"]}.items():
            r = cli(["rag", "deeprag", "synth", "-m", f"openai:s@{url}", "-d", qa, "--index", tmp_path / "idx",
                     *extra, "-o", tmp_path / name, "--json"])
            assert r.exit_code == 0, r.stderr
            metrics[name] = json.loads(r.stdout)["metrics"]
    n = len(kb.questions)
    assert metrics["paper"]["decompose"] == "model" and metrics["paper"]["pairs_format"] == "decision"
    assert metrics["paper"]["retrievals_per_path"] == metrics["gold"]["retrievals_per_path"] == pytest.approx(
        sum(q["unknown_hops"] for q in kb.questions) / n)
    assert metrics["always"]["found_rate"] == 1.0 and metrics["always"]["pairs"] == 0
    assert metrics["always"]["retrievals_per_path"] == pytest.approx(sum(q["hops"] for q in kb.questions) / n)
    assert metrics["never"]["paths_found"] == sum(q["unknown_hops"] == 0 for q in kb.questions)
    assert metrics["never"]["retrievals_per_path"] == 0
    pairs = [json.loads(line) for line in (tmp_path / "paper" / "pairs.jsonl").read_text().splitlines()]
    assert {(p["chosen"], p["rejected"]) for p in pairs} <= {("Let's search the question in Wikipedia.",
                                                              "Intermediate answer:"),
                                                             ("Intermediate answer:",
                                                              "Let's search the question in Wikipedia.")}
    assert sum(p["retrieve"] for p in pairs) == sum(q["unknown_hops"] for q in kb.questions)
    # the baselines' data has an empty pairs.jsonl: stage I alone trains on it, stage II refuses it (exit 2)
    r = cli(["rag", "deeprag", "train", "-m", tiny_gpt2_dir, "-d", tmp_path / "always", "--set", "stages=[sft]",
             "--set", "max_length=128", "-o", tmp_path / "always-sft", "--json"])
    assert r.exit_code == 0, r.stderr
    r = cli(["rag", "deeprag", "train", "-m", tiny_gpt2_dir, "-d", tmp_path / "always", "-o", tmp_path / "x"])
    assert r.exit_code == 2 and "pairs.jsonl" in r.stderr


def test_dense_index_save_load_identical(tmp_path):
    from toolkit.rag.retrieval import DenseRetriever, Passage, load_index, save_index

    passages = [Passage(str(i), t, x) for i, (t, x) in enumerate([("Paris", "Paris is the capital of France."),
                                                                  ("Rome", "Rome is the capital of Italy."),
                                                                  ("Oslo", "Oslo lies in Norway.")])]
    dense = DenseRetriever(passages)
    save_index(dense, tmp_path / "d")
    reloaded = load_index(tmp_path / "d")
    first = dense.search(["Which city is Italy's capital?"], 2)
    assert first == reloaded.search(["Which city is Italy's capital?"], 2) and first[0][0][0].title == "Rome"


def _hotpot_reply(prompt: str) -> str:
    """A scripted DeepRAG model for the "Who wrote X?" hotpot rows: one follow-up, answered from the retrieved
    paragraph."""
    if prompt.endswith("Question: Who wrote X?\n"):
        return "Follow up: Who wrote X?"
    if prompt.endswith("Follow up: Who wrote X?\n"):
        return "Let's search the question in Wikipedia."
    if prompt.endswith("Intermediate answer:"):
        return " Ann" if "written by Ann" in prompt else " unknown"
    return "So the final answer is: <answer short>Ann</answer short>"


def test_hotpot_per_question_contexts_and_dry_run(cli, tmp_path):
    row = {"question_id": "h1", "question_text": "Who wrote X?", "answers_objects": [{"spans": ["Ann"]}],
           "contexts": [{"id": "0", "title": "X", "paragraph_text": "X was written by Ann.", "is_supporting": True},
                        {"id": "1", "title": "Y", "paragraph_text": "Y is a river.", "is_supporting": False}]}
    data = tmp_path / "hotpot.jsonl"
    data.write_text(json.dumps(row))
    with LoopbackServer(reply=_hotpot_reply) as url:
        r = cli(["rag", "deeprag", "run", "-m", f"openai:s@{url}", "-d", data, "--index", "contexts",
                 "--methods", "deeprag,single", "-o", tmp_path / "run"])
        assert r.exit_code == 0, r.stderr
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    assert rows[0]["em"] == 1.0 and rows[0]["retrievals_per_question"] == 1.0
    r = cli(["rag", "deeprag", "run", "-m", "openai:s@http://127.0.0.1:9/v1", "-d", data, "--index", "contexts",
             "--dry-run"])
    assert r.exit_code == 0 and not (tmp_path / "dry").exists()


@pytest.mark.parametrize("case", ["missing-corpus", "malformed-qa", "bad-method", "no-index", "bad-topk",
                                  "train-no-synth", "contexts-without-paragraphs", "bad-check"])
def test_bad_input_exits_2(cli, files, tmp_path, case):
    corpus, qa = files
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "a"}\n{broken')
    args = {
        "missing-corpus": ["index", "--corpus", tmp_path / "nope.jsonl"],
        "malformed-qa": ["run", "-m", "openai:s@http://127.0.0.1:9/v1", "-d", bad, "--index", "contexts"],
        "bad-method": ["run", "-m", "x", "-d", qa, "--index", "contexts", "--methods", "deeprag,oracle"],
        "no-index": ["run", "-m", "openai:s@http://127.0.0.1:9/v1", "-d", qa, "--index", tmp_path / "none"],
        "bad-topk": ["synth", "-m", "x", "-d", qa, "--index", "contexts", "--top-k", "0"],
        "train-no-synth": ["train", "-m", "x", "-d", tmp_path],
        "bad-check": ["synth", "-m", "x", "-d", qa, "--index", "contexts", "--set", "parametric_check=gold"],
        "contexts-without-paragraphs": ["run", "-m", "openai:s@http://127.0.0.1:9/v1", "-d", qa, "--index",
                                        "contexts"],
    }[case]
    r = cli(["rag", "deeprag", *args, "-o", tmp_path / "out"])
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_run_concurrency_is_a_config_key_with_identical_results(cli, tmp_path):
    rows = [{"question_id": f"h{i}", "question_text": "Who wrote X?", "answers_objects": [{"spans": ["Ann"]}],
             "contexts": [{"id": "0", "title": "X", "paragraph_text": "X was written by Ann.", "is_supporting": True}]}
            for i in range(4)]
    data = tmp_path / "hotpot.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows))

    config = tmp_path / "run.yaml"
    config.write_text("concurrency: 3\n")
    seen = {}
    for name, extra, gate in [("one", [], 0), ("three", ["--config", config], 3)]:
        server = LoopbackServer(reply=_hotpot_reply, gate=gate)
        with server as url:
            r = cli(["rag", "deeprag", "run", "-m", f"openai:s@{url}", "-d", data, "--index", "contexts", *extra,
                     "-o", tmp_path / name])
        assert r.exit_code == 0, r.stderr
        seen[name] = (server.max_in_flight, json.loads((tmp_path / name / "run.json").read_text())["config"],
                      (tmp_path / name / "results.json").read_text())
    assert seen["one"][0] == 1 and seen["three"][0] == 3  # the four questions' requests go out together
    assert seen["one"][1]["concurrency"] == 1 and seen["three"][1]["concurrency"] == 3
    assert seen["one"][2] == seen["three"][2]
    r = cli(["rag", "deeprag", "synth", "-m", "openai:s@http://127.0.0.1:9/v1", "-d", data, "--index", "contexts",
             "--set", "concurrency=0", "-o", tmp_path / "bad"])
    assert r.exit_code == 2 and "concurrency" in r.stderr and not (tmp_path / "bad").exists()
