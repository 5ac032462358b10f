"""OpenAI-compatible backend: a bounded pool of concurrent requests (results in input order), the client's own
retries, a llama.cpp-style server that refuses echo log-probs (clear error, exit 3), --concurrency 0 (exit 2)."""

from __future__ import annotations

import pytest

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.llm import load_llm
from toolkit.llm.server import LoopbackServer


def test_concurrent_requests_are_bounded_and_in_input_order():
    server = LoopbackServer(reply=lambda prompt: f"<{prompt}>", gate=4)
    prompts = [f"p{i}" for i in range(12)]
    with server as url:
        llm = load_llm(f"openai:loopback@{url}", concurrency=4)
        texts = [c.text for c in llm.generate(prompts)]
    assert texts == [f"<{p}>" for p in prompts]
    assert 1 < server.max_in_flight <= 4  # the gate holds requests until 4 are in flight at once


def test_sequential_by_default():
    server = LoopbackServer(reply=lambda prompt: prompt)
    with server as url:
        llm = load_llm(f"openai:loopback@{url}")
        assert [c.text for c in llm.generate(["a", "b", "c"], chat=True)] == ["a", "b", "c"]
    assert server.max_in_flight == 1


def test_scores_keep_input_order_under_concurrency(tiny_llama_dir):
    from toolkit.llm.hf import HFBackend

    hf = HFBackend(str(tiny_llama_dir))
    prompts, continuations = ["The answer is", "def main", "import"] * 2, [" yes", " no", " os"] * 2
    server = LoopbackServer(backend=hf, gate=3)
    with server as url:
        remote = load_llm(f"openai:tiny@{url}", concurrency=3).score(prompts, continuations)
    local = hf.score(prompts, continuations)
    assert [r.logprob for r in remote] == pytest.approx([s.logprob for s in local], abs=1e-4)
    assert 1 < server.max_in_flight <= 3


def test_server_refusing_echo_names_the_limitation():
    with LoopbackServer(reply=lambda prompt: "x", refuse_echo=True) as url:
        llm = load_llm(f"openai:llamacpp@{url}")
        assert llm.generate(["hi"])[0].text == "x"  # generation still works
        with pytest.raises(ResourceError, match="cannot score supplied text: llama.cpp") as info:
            llm.score(["a"], ["b"])
    assert info.value.exit_code == 3 and "Only no echo is supported" in str(info.value)


def test_retries_are_the_clients_own():
    llm = load_llm("openai:m@http://127.0.0.1:9/v1", timeout=1.0)
    assert llm.client.max_retries == 3
    llm.retries = 0
    assert llm.client.max_retries == 0
    with pytest.raises(ResourceError, match="failed after 1 tries"):
        llm.generate(["x"])


@pytest.mark.parametrize("value", [0, -2])
def test_bad_concurrency(value):
    with pytest.raises(BadInputError, match="concurrency"):
        load_llm("openai:m@http://127.0.0.1:9/v1", concurrency=value)


def test_cli_concurrency_zero_exits_2(cli, tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "q?", "answer": "a"}\n')
    result = cli(["rag", "deeprag", "run", "-m", "openai:m@http://127.0.0.1:9/v1", "-d", data, "--index", "contexts",
                  "--concurrency", "0", "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "invalid config value for 'concurrency'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    result = cli(["prompt", "mhlp", "--task-model", "openai:m@http://127.0.0.1:9/v1", "--proposer-model",
                  "openai:m@http://127.0.0.1:9/v1", "-d", data, "--concurrency", "0", "-o", tmp_path / "o"])
    assert result.exit_code == 2 and "concurrency" in result.stderr


def test_ordered_map_is_bounded_and_keeps_input_order():
    import threading

    from toolkit.llm.pool import ordered_map

    lock, state = threading.Lock(), {"now": 0, "most": 0}
    together = threading.Barrier(3, timeout=10)  # the first three calls meet: three run at once
    last_done = threading.Event()

    def call(i):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        if i < 3:
            together.wait()
        if i == 0:
            last_done.wait(10)  # item 0 finishes after the last one, yet comes out first
        if i == 7:
            last_done.set()
        with lock:
            state["now"] -= 1
        return i * i

    assert list(ordered_map(call, range(8), 3)) == [i * i for i in range(8)]
    assert state["most"] == 3


def test_ordered_map_sequential_in_the_callers_thread_and_errors_propagate():
    import threading

    from toolkit.llm.pool import ordered_map

    here = threading.get_ident()
    assert list(ordered_map(lambda i: threading.get_ident() == here, range(3), 1)) == [True] * 3

    def fails_on_two(i):
        if i == 2:
            raise ValueError("row 2")
        return i

    with pytest.raises(ValueError, match="row 2"):
        list(ordered_map(fails_on_two, range(6), 3))


def test_local_backends_take_one_request_at_a_time(tiny_llama_dir):
    assert load_llm(str(tiny_llama_dir), concurrency=8).concurrency == 1
