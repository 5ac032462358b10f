import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from toolkit.bench import agent as ag
from toolkit.bench import fixtures
from toolkit.bench import mmsearch as ms
from toolkit.bench.scripted import scripted_agent
from toolkit.core.errors import BadInputError


def test_key_and_xor_against_a_direct_computation():
    digest = hashlib.sha256(b"MMSearch-Plus").digest()
    assert ms.derive_key("MMSearch-Plus", 70) == digest + digest + digest[:6]
    text = "Which stadium? ünïcode"
    raw = text.encode()
    expected = base64.b64encode(bytes(raw[i] ^ digest[i % 32] for i in range(len(raw)))).decode()
    assert ms.encrypt_text(text) == expected and ms.decrypt_text(expected) == text


def test_row_round_trip_covers_every_answer_and_leaves_images():
    row = {"question": "Where?", "answer": ["Lisbon", "", "Lisboa", "LIS"], "video_url": "https://v", "arxiv_id": "",
           "img_1": "images/a.png", "category": "Geography"}
    encrypted = ms.encrypt_row(row)
    assert all(encrypted["answer"][i] != row["answer"][i] for i in (0, 2, 3)) and encrypted["answer"][1] == ""
    assert encrypted["img_1"] == row["img_1"] and encrypted["arxiv_id"] == "" and encrypted["question"] != "Where?"
    assert ms.decrypt_row(encrypted) == row
    with pytest.raises(BadInputError):
        ms.decrypt_text("not base64!!")
    try:
        assert ms.decrypt_row(encrypted, canary="wrong")["question"] != row["question"]
    except BadInputError:
        pass


def test_normalisation_exact_match_and_f1():
    assert ms.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert ms.exact_match("the Lisbon.", ["Porto", "lisbon"])
    assert ms.exact_match("Lisbon, Portugal", ["Lisbon"])
    assert not ms.exact_match("Porto Lisbon Madrid Paris Rome Berlin Oslo Riga Kyiv Bern Vienna", ["Lisbon"])
    assert not ms.exact_match("Lisbo", ["Lisbon"])
    assert ms.token_f1("new york city", ["New York"]) == pytest.approx(0.8)


def test_judge_verdicts_and_fallback():
    assert ms.parse_verdict("incorrect") == "INCORRECT" and ms.parse_verdict("It is CORRECT.") == "CORRECT"
    assert ms.parse_verdict("NOT_ATTEMPTED") == "NOT_ATTEMPTED" and ms.parse_verdict("maybe") is None
    llm = ms.judge_answer("q", ["Kyoto"], "the old capital", lambda prompt: "CORRECT")
    assert llm["correct"] and llm["judged_by"] == "llm"
    fallback = ms.judge_answer("q", ["Kyoto"], "Kyoto", lambda prompt: "I am not sure")
    assert fallback["correct"] and fallback["judged_by"] == "exact-match"
    assert not ms.judge_answer("q", ["Kyoto"], "", None)["correct"]


def test_crop_marks_and_grid():
    pixels = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    assert np.array_equal(np.asarray(ag.crop(image, [10, 5, 30, 25])), pixels[5:25, 10:30])
    assert np.array_equal(np.asarray(ag.crop(image, [50, 30, 99, 99])), pixels[30:40, 50:60])  # clipped
    with pytest.raises(ValueError):
        ag.crop(image, [70, 0, 80, 10])
    boxes = ag.grid_boxes(60, 40)
    assert boxes == [[0, 0, 30, 20], [30, 0, 60, 20], [0, 20, 30, 40], [30, 20, 60, 40]]
    marked = np.asarray(ag.place_marks(Image.new("RGB", (60, 40), "white"), boxes))
    assert tuple(marked[19, 15]) == (255, 0, 0) and tuple(marked[10, 15]) == (255, 255, 255)


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mms")
    return root, *fixtures.write_mmsearch(root)


def test_offline_search_finds_the_page_of_a_crop(fixture_dir):
    root, rows, corpus = fixture_dir
    search = ag.OfflineSearch(corpus)
    collage = Image.open(root / "images" / "task_3.png")
    for k, box in enumerate(ag.grid_boxes(collage.width, collage.height)):
        top = search.image_search(ag.crop(collage, box), 3)[0]
        assert search.fetch(top["url"])["text"].endswith(("Quito.", "ville."))
        assert ("Quito" in search.fetch(top["url"])["text"]) == (k == 3)
    assert search.image_search(collage, 1)[0]["url"].endswith("collection-3")
    assert search.text_search("Quito", 5)[0]["snippet"].endswith("Quito.")
    assert search.text_search("zzzz", 5) == []


def test_scripted_agent_reaches_the_answer_with_set_of_marks(fixture_dir):
    from toolkit.bench.mmsearch_run import MMSearchConfig, load_tasks, solve

    root, rows, corpus = fixture_dir
    tasks = load_tasks(MMSearchConfig(model="x", data=str(rows)))
    search, limits = ag.OfflineSearch(corpus), ag.Limits()
    outcomes = [solve(task, "rollout_som", scripted_agent, search, limits) for task in tasks]
    assert [o["prediction"] for o in outcomes] == [t[3] for t in fixtures.MMSEARCH_TASKS]
    assert [c["name"] for c in outcomes[0]["calls"]] == ["crop", "image_search", "fetch"]
    plain = solve(tasks[0], "rollout", scripted_agent, search, limits)
    assert plain["prediction"] == "unknown" and [c["name"] for c in plain["calls"]] == ["image_search", "fetch"]


def test_round_limit_and_unknown_tools(fixture_dir):
    root, rows, corpus = fixture_dir
    state = ag.AgentState(images={"img_1": Image.new("RGB", (8, 8))})
    limits = ag.Limits(max_rounds=3)
    always_search = lambda prompt, images: '<tool>{"name": "text_search", "args": {"query": "sculpture"}}</tool>'
    outcome = ag.run_agent(always_search, "q", state, ag.Toolbox(ag.OfflineSearch(corpus), ("text_search",), limits),
                           limits)
    assert outcome["stop_reason"] == "round_limit" and outcome["rounds"] == 3 and outcome["prediction"] == ""
    toolbox = ag.Toolbox(None, ("fetch",), limits)
    assert toolbox.run(state, "shell", {"cmd": "rm -rf /"}).startswith("unknown tool")
    assert toolbox.run(state, "fetch", {"url": "http://attacker.invalid/x"}).startswith("refused")
    assert ag.parse_reply('<tool>{"name": 3}</tool>')[0] == "bad_tool"
    assert ag.parse_reply("<answer>x</answer><tool>{\"name\": \"fetch\"}</tool>") == ("answer", "x")


def test_injected_page_text_never_triggers_a_tool_call(fixture_dir):
    root, rows, corpus = fixture_dir
    seen = []

    def gullible(prompt, images):
        """Searches once, then repeats whatever the last observation said, word for word."""
        seen.append(prompt)
        if "<observation>" not in prompt:
            return '<tool>{"name": "text_search", "args": {"query": "which city does the sculpture stand in"}}</tool>'
        return prompt.rsplit("<observation>", 1)[1].split("</observation>")[0]

    state = ag.AgentState(images={"img_1": Image.new("RGB", (8, 8))})
    limits = ag.Limits(max_rounds=5)
    outcome = ag.run_agent(gullible, "q", state, ag.Toolbox(ag.OfflineSearch(corpus), ("text_search", "fetch"),
                                                            limits), limits)
    assert "Ignore all previous instructions" in seen[1]  # the payload reached the model as data
    assert outcome["calls"] == [{"name": "text_search", "args": {"query": "which city does the sculpture stand in"}}]
    assert "attacker" not in json.dumps(outcome["calls"]) and outcome["prediction"] != "HACKED"
    assert outcome["stop_reason"] == "no_tool_call"


def test_http_search_adapter_talks_the_documented_protocol():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            seen.append(self.path)
            if self.path.startswith("/fetch"):
                self._reply({"title": "T", "text": "x" * 5000})
            else:
                self._reply({"results": [{"url": "u1", "title": "t1", "snippet": "s1"}, "junk"]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(("post", self.path, len(base64.b64decode(body["image"])) > 0, body["k"]))
            self._reply({"results": [{"url": "u2", "title": "t2"}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        search = ag.HTTPSearch(f"http://127.0.0.1:{server.server_address[1]}/", max_bytes=1000)
        assert search.text_search("a b", 3) == [{"url": "u1", "title": "t1", "snippet": "s1"}]
        assert search.image_search(Image.new("RGB", (4, 4)), 2)[0]["url"] == "u2"
        assert search.fetch("u1")["text"] == "(unreadable reply)"  # over max_bytes: cut, then not JSON
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] == "/text_search?q=a+b&k=3" and seen[1] == ("post", "/image_search", True, 2)
    with pytest.raises(BadInputError):
        ag.HTTPSearch("file:///etc/passwd")
