import json

import pytest

from toolkit.bench.scripted import scripted_agent_reply, scripted_vlm
from toolkit.llm.server import LoopbackServer


def run_json(out):
    return json.loads((out / "run.json").read_text())


def test_fixtures_command_writes_both_sets(cli, tmp_path):
    result = cli(["bench", "fixtures", "-o", tmp_path / "fx", "--json"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "fx" / "videomathqa" / "videos" / "synthetic_05.mp4").is_file()
    assert (tmp_path / "fx" / "mmsearch" / "corpus" / "pages.jsonl").is_file()


def test_videomathqa_direct_mcq_and_mbin_through_loopback(cli, bench_data, tmp_path):
    server = LoopbackServer(reply=scripted_vlm)
    with server as url:
        model = f"openai:vlm@{url}"
        mcq = cli(["bench", "videomathqa", "-m", model, "-d", bench_data / "videomathqa", "--frame-num", 4,
                   "--subtitles", "-o", tmp_path / "mcq"])
        mbin = cli(["bench", "videomathqa", "-m", model, "-d", bench_data / "videomathqa", "--task", "mbin",
                    "--frame-num", 2, "-o", tmp_path / "mbin"])
    assert mcq.exit_code == 0 and mbin.exit_code == 0, mcq.stderr + mbin.stderr
    metrics = run_json(tmp_path / "mcq")["metrics"]
    assert metrics["variant"] == "mcq_w_subtitle" and metrics["modality"].startswith("vision")
    assert metrics["accuracy"] == pytest.approx(400 / 6) and metrics["questions"] == 6
    assert metrics["length"]["long"] == {"accuracy": 0.0, "n": 2}
    assert metrics["category"]["Geometry Angle"]["accuracy"] == 100.0
    assert metrics["reasoning_type"]["Problem Focused"] == {"accuracy": 100.0, "n": 2}
    first = server.requests[0]["messages"][0]["content"]
    images = [part for part in first if part["type"] == "image_url"]
    assert len(images) == 4 and images[0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert "Hint: Angles of a triangle sum to 180 degrees." in first[-1]["text"]
    # multi-binary: 4 pairs per question; q2 misses one pair, q4/q5 are right on all pairs
    binary = run_json(tmp_path / "mbin")["metrics"]
    assert binary["variant"] == "mbin" and binary["questions"] == 6
    assert binary["accuracy"] == pytest.approx(500 / 6)
    lines = (tmp_path / "mbin" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 24


def test_videomathqa_cot_with_extractor_fallback_and_step_judge(cli, bench_data, tmp_path):
    with LoopbackServer(reply=scripted_vlm) as url:
        model = f"openai:vlm@{url}"
        result = cli(["bench", "videomathqa", "-m", model, "-d", bench_data / "videomathqa", "--cot",
                      "--judge-model", model, "--set", "use_images=false", "-o", tmp_path / "cot", "--json"])
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)["metrics"]
    # right: q0 q1 q2; q3's extractor fails -> a wrong letter; q4 q5 wrong
    assert metrics["accuracy"] == 50.0 and metrics["extractor_failures"] == 1
    assert metrics["step_score"] == pytest.approx(14 / 6) and metrics["step_score_judge_errors"] == 4
    assert metrics["modality"].startswith("text-only")


def test_mmsearch_four_modes_through_loopback(cli, bench_data, tmp_path):
    root = bench_data / "mmsearch"
    with LoopbackServer(reply=scripted_agent_reply) as url:
        result = cli(["bench", "mmsearch", "-m", f"openai:vlm@{url}", "-d", root,
                      "--search", f"offline:{root / 'corpus' / 'pages.jsonl'}", "-o", tmp_path / "mms"])
        judged = cli(["bench", "mmsearch", "-m", f"openai:vlm@{url}", "-d", root / "mmsearch_plus.jsonl",
                      "--mode", "no_search", "--mode", "rollout_som", "--judge-model", f"openai:judge@{url}",
                      "--search", f"offline:{root / 'corpus' / 'pages.jsonl'}", "-o", tmp_path / "judged"])
    assert result.exit_code == 0 and judged.exit_code == 0, result.stderr + judged.stderr
    metrics = run_json(tmp_path / "mms")["metrics"]
    assert metrics["judge"] == "exact-match"
    accuracy = {mode: table["accuracy"] for mode, table in metrics["modes"].items()}
    assert accuracy == {"no_search": 0.0, "image_search": 0.0, "rollout": 0.0, "rollout_som": 100.0}
    som = metrics["modes"]["rollout_som"]
    assert som["by_category"]["Sports"] == {"accuracy": 100.0, "n": 1} and som["by_difficulty"]["hard"]["n"] == 3
    assert som["mean_tool_calls"] == 3.0
    predictions = (tmp_path / "mms" / "predictions.jsonl").read_text()
    assert "In which city" not in predictions  # decrypted questions stay out of the logs by default
    other = run_json(tmp_path / "judged")["metrics"]
    assert other["judge"].startswith("llm:openai:judge") and other["judge_fallbacks"] == 0
    assert other["modes"]["rollout_som"]["accuracy"] == 100.0 and other["modes"]["no_search"]["accuracy"] == 0.0


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", ["missing", "malformed", "bad_letter", "bad_frames", "no_video"])
def test_videomathqa_bad_input_exits_2(cli, bench_data, tmp_path, case):
    good = json.loads((bench_data / "videomathqa" / "mcq.jsonl").read_text().splitlines()[0])
    data = {"missing": tmp_path / "nope.jsonl",
            "malformed": write(tmp_path / "m.jsonl", '{"question_id": 1,\n'),
            "bad_letter": write(tmp_path / "b.jsonl", json.dumps({**good, "answer": "F"})),
            "bad_frames": bench_data / "videomathqa",
            "no_video": write(tmp_path / "v.jsonl", json.dumps({**good, "videoID": "absent"}))}[case]
    extra = ["--set", "frame_num=-3"] if case == "bad_frames" else []
    result = cli(["bench", "videomathqa", "-m", "openai:m@http://127.0.0.1:9/v1", "-d", data, *extra,
                  "-o", tmp_path / "out"])
    assert result.exit_code == 2, result.stderr
    assert "error:" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["no_search_backend", "wrong_canary", "empty"])
def test_mmsearch_bad_input_exits_2(cli, bench_data, tmp_path, case):
    root = bench_data / "mmsearch"
    args = {"no_search_backend": ["-d", root, "--mode", "rollout"],
            "wrong_canary": ["-d", root, "--mode", "no_search", "--set", "canary=not-it"],
            "empty": ["-d", write(tmp_path / "e.jsonl", "\n"), "--mode", "no_search"]}[case]
    with LoopbackServer(reply=lambda prompt: "<answer>x</answer>") as url:
        result = cli(["bench", "mmsearch", "-m", f"openai:m@{url}", *args, "-o", tmp_path / "out"])
    assert result.exit_code == 2, result.stderr
    assert not (tmp_path / "out").exists()


def test_dry_runs_plan_without_a_model(cli, bench_data):
    vmqa = cli(["bench", "videomathqa", "-m", "zoo:absent", "-d", bench_data / "videomathqa", "--task", "mbin",
                "--dry-run"])
    assert vmqa.exit_code == 0 and json.loads(vmqa.stdout)["plan"]["rows"] == 24
    mms = cli(["bench", "mmsearch", "-m", "zoo:absent", "-d", bench_data / "mmsearch", "--mode", "no_search",
               "--dry-run"])
    assert mms.exit_code == 0 and json.loads(mms.stdout)["plan"]["runs"] == 5
