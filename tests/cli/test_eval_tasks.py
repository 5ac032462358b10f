"""`iclrkit eval tasks`: lm-evaluation-harness on a tiny model over a task YAML and JSON file written here
(offline), the same numbers as an independent log-likelihood computation, packed models with their fake-quant
hooks, and bad input (unknown task, a task that needs the network while offline: one line, exit code, no --out)."""

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")
lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install lm-eval)")

DOCS = [{"question": "The sky is", "choices": [" blue", " green"], "label": 0},
        {"question": "Two plus two is", "choices": [" four", " five"], "label": 0},
        {"question": "Ice is", "choices": [" hot", " cold"], "label": 1},
        {"question": "The sun rises in the", "choices": [" west", " east"], "label": 1}]


@pytest.fixture()
def local_task(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")  # read at import time
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    folder = tmp_path / "tasks"
    folder.mkdir()
    data = tmp_path / "docs.json"
    data.write_text(json.dumps(DOCS))
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: label\n"
        "target_delimiter: ''\n"
        "metric_list:\n  - metric: acc\n"
        "metadata:\n  version: 1.0\n")
    (folder / "needs_hub.yaml").write_text(
        "task: needs_hub\n"
        "dataset_path: iclrkit-test/does-not-exist-offline\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: ['a', 'b']\n"
        "doc_to_target: 0\n"
        "metadata:\n  version: 1.0\n")
    return folder


def _reference_accuracy(model_dir) -> float:
    """Pick the choice with the higher summed log-probability of its tokens (lm-eval's `acc`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    correct = 0
    for doc in DOCS:
        context = tokenizer(doc["question"])["input_ids"]
        scores = []
        for choice in doc["choices"]:
            whole = tokenizer(doc["question"] + choice)["input_ids"]
            continuation = whole[len(context):]
            ids = torch.tensor([whole])
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            positions = range(len(whole) - len(continuation) - 1, len(whole) - 1)
            scores.append(sum(logprobs[p, whole[p + 1]].item() for p in positions))
        correct += int(max(range(2), key=lambda i: scores[i]) == doc["label"])
    return correct / len(DOCS)


def test_local_task_offline_matches_reference(cli, tiny_llama_dir, local_task, tmp_path):
    out = tmp_path / "tasks-out"
    r = cli(["--offline", "eval", "tasks", "--model", tiny_llama_dir, "--tasks", "tiny_mc", "--include-path",
             local_task, "--batch-size", "2", "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert metrics["tasks"]["tiny_mc"]["acc"] == pytest.approx(_reference_accuracy(tiny_llama_dir))
    assert metrics["quant_setting"].startswith("as loaded")
    saved = json.loads((out / "lm_eval_results.json").read_text())
    assert "tiny_mc" in saved["results"]


def test_packed_model_is_evaluated_with_its_quant_hooks(cli, tiny_llama_dir, local_task, tmp_path, text_file):
    run = tmp_path / "run"
    r = cli(["compress", "rtn", "--model", tiny_llama_dir, "--data", text_file, "--a-bits", "4", "--kv-bits", "4",
             "--nsamples", "2", "--seqlen", "32", "--set", "export=packed", "--out", run])
    assert r.exit_code == 0, r.stderr
    r = cli(["--offline", "eval", "tasks", "--model", run / "packed", "--tasks", "tiny_mc", "--include-path",
             local_task, "--json"])
    assert r.exit_code == 0, r.stderr
    assert "A4KV4 (activation/KV fake-quant hooks on)" in json.loads(r.stdout)["metrics"]["quant_setting"]


def test_network_task_offline_is_one_line_exit_3(cli, tiny_llama_dir, local_task, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "never"
    r = cli(["--offline", "eval", "tasks", "--model", tiny_llama_dir, "--tasks", "needs_hub", "--include-path",
             local_task, "--out", out])
    assert r.exit_code == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the network" in lines[0]
    assert not out.exists() and not (tmp_path / "never.partial").exists()


def test_unknown_task_exits_2(cli, tiny_llama_dir, local_task, monkeypatch):
    import lm_eval.tasks

    real = lm_eval.tasks.TaskManager  # the built-in index (~15k YAMLs, ~20 s) is not what this test is about
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kw: real(**{**kw, "include_defaults": False}))
    r = cli(["--offline", "eval", "tasks", "--model", tiny_llama_dir, "--tasks", "no_such_task_xyz",
             "--include-path", local_task])
    assert r.exit_code == 2 and "unknown lm-eval task" in r.stderr
