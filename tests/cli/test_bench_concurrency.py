"""`bench videomathqa` and `bench mmsearch` keep `concurrency` requests in flight in every per-row stage (answers,
CoT letter extraction, step judge, agent runs, answer judge), with the same predictions as concurrency 1.

Each stage talks to its own loopback server, which counts the requests in flight; with `gate=N` it holds the
first requests until N are in flight at once, so reaching N does not depend on timing (a client that never sends
N at once is released after the gate's timeout and shows fewer)."""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from toolkit.bench.scripted import scripted_agent_reply, scripted_vlm
from toolkit.llm.server import LoopbackServer


def outputs(out):
    record = json.loads((out / "run.json").read_text())
    return record, (out / "predictions.jsonl").read_text()


def run_with_servers(cli, names, reply, concurrency, build_args):
    """Start one server per stage (gated at `concurrency` when > 1), run the command, return servers + result."""
    gate = concurrency if concurrency > 1 else 0
    with ExitStack() as stack:
        servers = {name: LoopbackServer(reply=reply, model_name=name, gate=gate) for name in names}
        urls = {name: stack.enter_context(server) for name, server in servers.items()}
        result = cli(build_args({name: f"openai:{name}@{url}" for name, url in urls.items()}))
    assert result.exit_code == 0, result.stderr
    return servers


def test_videomathqa_stages_keep_n_in_flight_with_identical_predictions(cli, bench_data, tmp_path):
    def args(out, *extra):
        return lambda spec: ["bench", "videomathqa", "-m", spec["answer"], "-d", bench_data / "videomathqa", "--cot",
                             "--extractor-model", spec["extract"], "--judge-model", spec["judge"],
                             "--set", "use_images=false", *extra, "-o", out]

    stages = ("answer", "extract", "judge")
    one = run_with_servers(cli, stages, scripted_vlm, 1, args(tmp_path / "c1"))
    three = run_with_servers(cli, stages, scripted_vlm, 3, args(tmp_path / "c3", "--concurrency", "3"))
    assert {name: s.max_in_flight for name, s in one.items()} == dict.fromkeys(stages, 1)
    assert {name: s.max_in_flight for name, s in three.items()} == dict.fromkeys(stages, 3)
    assert all(len(s.requests) == 6 for s in (*one.values(), *three.values()))  # one request per row and stage
    (record1, predictions1), (record3, predictions3) = outputs(tmp_path / "c1"), outputs(tmp_path / "c3")
    assert predictions1 == predictions3  # incl. the extractor's random fallback letter for q3, drawn in row order
    assert record1["metrics"] == record3["metrics"] and record3["metrics"]["extractor_failures"] == 1
    assert record1["config"]["concurrency"] == 1 and record3["config"]["concurrency"] == 3


def test_mmsearch_agents_and_judge_keep_n_in_flight_with_identical_predictions(cli, bench_data, tmp_path):
    root = bench_data / "mmsearch"

    def args(out, *extra):
        return lambda spec: ["bench", "mmsearch", "-m", spec["agent"], "-d", root, "--judge-model", spec["judge"],
                             "--search", f"offline:{root / 'corpus' / 'pages.jsonl'}", *extra, "-o", out]

    one = run_with_servers(cli, ("agent", "judge"), scripted_agent_reply, 1, args(tmp_path / "c1"))
    four = run_with_servers(cli, ("agent", "judge"), scripted_agent_reply, 4,
                            args(tmp_path / "c4", "--set", "concurrency=4"))
    assert one["agent"].max_in_flight == one["judge"].max_in_flight == 1
    assert four["agent"].max_in_flight == four["judge"].max_in_flight == 4
    assert len(four["judge"].requests) == len(one["judge"].requests) == 20  # 4 modes x 5 tasks
    (record1, predictions1), (record4, predictions4) = outputs(tmp_path / "c1"), outputs(tmp_path / "c4")
    assert predictions1 == predictions4
    assert record1["metrics"]["modes"] == record4["metrics"]["modes"]
    assert record4["metrics"]["modes"]["rollout_som"]["accuracy"] == 100 and record4["metrics"]["judge_fallbacks"] == 0
    assert record4["config"]["concurrency"] == 4


def test_concurrency_from_a_config_file_is_recorded(cli, bench_data, tmp_path):
    config = tmp_path / "bench.yaml"
    config.write_text("concurrency: 2\ntask: mbin\n")
    with LoopbackServer(reply=scripted_vlm, gate=2) as url:
        server_args = ["-m", f"openai:vlm@{url}", "-d", bench_data / "videomathqa", "--set", "use_images=false"]
        result = cli(["bench", "videomathqa", *server_args, "--config", config, "-o", tmp_path / "o", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["config"]["concurrency"] == 2


@pytest.mark.parametrize("command", ["videomathqa", "mmsearch"])
@pytest.mark.parametrize("how", [["--concurrency", "0"], ["--set", "concurrency=0"], ["--set", "concurrency=-1"]])
def test_concurrency_below_one_exits_2_and_writes_nothing(cli, bench_data, tmp_path, command, how):
    result = cli(["bench", command, "-m", "openai:m@http://127.0.0.1:9/v1", "-d", bench_data / command, *how,
                  "-o", tmp_path / "out"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "concurrency" in lines[0]
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
