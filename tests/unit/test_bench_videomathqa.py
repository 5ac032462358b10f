import numpy as np
import pytest

from toolkit.bench import video
from toolkit.bench import videomathqa as vm
from toolkit.core.errors import BadInputError


@pytest.mark.parametrize("prefix", vm.ANSWER_PREFIXES)
def test_every_answer_prefix_is_stripped_on_its_own(prefix):
    # prefixes starting with "B" ("Best ...") would otherwise yield the letter B
    assert vm.extract_characters_regex(f"{prefix} D") == "D"
    assert vm.extract_characters_regex(f"  {prefix} (C).") == "C"


def test_prefixes_glued_upstream_are_fixed():
    # upstream's missing commas leave "Best answer:" / "The correct option is" unstripped; "Best" then gives B
    assert vm.extract_characters_regex("Best answer: C") == "C"
    assert vm.extract_characters_regex("Best option: E") == "E"
    assert "The best option isThe correct option is" not in vm.ANSWER_PREFIXES


def test_extraction_rules():
    assert vm.extract_characters_regex("the result is forty five because the angles sum to one eighty") == ""
    assert vm.extract_characters_regex("x") == ""
    assert vm.extract_characters_regex("E. 9") == "E"
    long_with_letter = "after a lot of careful work we conclude that option C is the one we want"
    assert vm.extract_characters_regex(long_with_letter) == "C"


def test_uniform_sample_matches_formula():
    for m in range(1, 40):
        for n in range(1, m + 1):
            stride = (m - 1) / (n - 1) if n > 1 else 0  # upstream multiplies the float stride (ties round to even)
            expected = [int(round(i * stride)) for i in range(n)]
            assert video.uniform_sample(m, n) == expected
            assert expected[-1] == (m - 1 if n > 1 else 0) and len(set(expected)) == n  # ends kept, no repeats
    assert video.uniform_sample(8, 4) == [0, 2, 5, 7]
    with pytest.raises(BadInputError):
        video.uniform_sample(3, 4)


def test_srt_parsing_and_frame_alignment():
    srt = ("1\r\n00:00:00,000 --> 00:00:01,500\r\nfirst line\r\nsecond\r\n\r\n"
           "2\n00:00:05,000 --> 00:00:06,000\nlate cue\n\n3\n00:00:01,500 --> 00:00:02,000\nmiddle\n")
    cues = video.parse_srt(srt)
    assert [c.text for c in cues] == ["first line second", "late cue", "middle"]
    assert cues[0].end == 1.5 and video.parse_srt_time("01:02:03,4") == 3723.4
    fps, total = 4.0, 12  # 3 s of video; the late cue is never on screen
    for n in (1, 2, 3, 12):
        sampled = np.linspace(0, total - 1, n, dtype=int)
        expected = [c.text for c in cues if any(int(c.start * fps) <= f < int(c.end * fps) for f in sampled)]
        assert video.subtitles_for_frames(cues, fps, total, n) == "\n".join(expected)
    assert video.subtitles_for_frames(cues, fps, total, -1) == "first line second\nmiddle"
    with pytest.raises(BadInputError):
        video.parse_srt("1\n00:00 --> 00:01\ntext\n")


def test_prompts_match_the_task_text():
    options = ["A. 1", "B. 2", "C. 3", "D. 4", "E. 5"]
    direct = vm.build_prompt("Q?", options, cot=False)
    assert direct == ("Select the best answer to the following multiple-choice question based on the video. "
                      "Respond with the letter (A, B, C, D or E) of the correct option.\nQ?\nA. 1\nB. 2\nC. 3\nD. 4\n"
                      "E. 5\n\nAnswer with the option's letter (A, B, C, D or E) from the given choices directly.")
    with_subs = vm.build_prompt("Q?", options[:2], cot=True, subtitles="")
    assert with_subs.startswith("This video's subtitles are listed below: \nNo subtitles available\nSelect")
    assert "based on the video and the subtitles. Respond with the letter (A or B)" in with_subs
    assert with_subs.endswith("with the option's letter (A or B) from the given choices.")


def test_multi_binary_needs_every_pair():
    row = {"question_id": "q", "options": ["A. 1", "B. 2", "C. 3", "D. 4", "E. 5"], "answer": "C",
           "category": "Chart", "length": "short"}
    pairs = vm.binary_pairs(row)
    assert len(pairs) == 4
    for pair in pairs:  # the correct text sits at the answer letter, and the other option is a distractor
        index = "AB".index(pair["answer"])
        assert pair["options"][index][3:] == "3" and pair["options"][1 - index][3:] != "3"
    assert [p["answer"] for p in pairs] == ["A", "B", "A", "B"]
    records = [{**p, "pred_answer": p["answer"]} for p in pairs]
    assert vm.score_table(records, multi_binary=True)["accuracy"] == 100.0
    records[2]["pred_answer"] = "B"
    assert vm.score_table(records, multi_binary=True)["accuracy"] == 0.0
    # per pair it would have been 75 %: the MCQ-style mean is not what multi-binary reports
    assert vm.score_table(records, multi_binary=False)["accuracy"] == 75.0


def test_mcq_tables_by_length_and_category():
    def rec(qid, length, category, right):
        return {"question_id": qid, "length": length, "category": category, "answer": "A",
                "pred_answer": "A" if right else "B", "reasoning_type": "Problem Focused"}

    records = [rec(1, "short", "Chart", True), rec(2, "short", "Chart", False), rec(3, "long", "Chart", True),
               rec(4, "long", "Puzzle", True)]
    table = vm.score_table(records, multi_binary=False)
    assert table["accuracy"] == 75.0 and table["questions"] == 4
    assert table["length"] == {"long": {"accuracy": 100.0, "n": 2}, "short": {"accuracy": 50.0, "n": 2}}
    assert table["category"]["Chart"] == {"accuracy": pytest.approx(200 / 3), "n": 3}
    assert table["length_category"]["short_Chart"]["accuracy"] == 50.0
    assert table["reasoning_type"]["Problem Focused"]["n"] == 4


def test_score_card_parsing():
    good = 'thinking... SCORE_CARD: x\nfinal SCORE_CARD: {"matched_steps": "2/3", "final_answer_correct": 1, ' \
           '"critique": " fine ", "score": 7}'
    assert vm.parse_score_card(good) == {"matched_steps": "2/3", "final_answer_correct": 1, "critique": "fine",
                                         "score": 7}
    python_literal = "SCORE_CARD: {'matched_steps': '1/4', 'final_answer_correct': 0, 'critique': 'x', 'score': '3'}"
    assert vm.parse_score_card(python_literal)["score"] == 3
    for bad in ("no card at all", 'SCORE_CARD: {"score": 7} trailing words', "SCORE_CARD: [1, 2]",
                'SCORE_CARD: {"score": "ten"}', ""):
        assert vm.parse_score_card(bad) == vm.FAILED_SCORE_CARD
    prompt = vm.step_judge_prompt("Q", ["A. 1"], ["s1", "s2"], "A", "pred")
    assert "GROUND TRUTH STEPS:\n[\n  \"s1\",\n  \"s2\"\n]" in prompt and prompt.rstrip().endswith('"score": <0–10>}')


def test_cot_fallback_is_always_a_wrong_letter():
    rng = np.random.default_rng(0)
    for answer, n in (("A", 5), ("E", 5), ("B", 2)):
        letters = {vm.cot_letter("text", ["o"] * n, answer, lambda p: "I cannot tell", rng)[0] for _ in range(50)}
        assert answer not in letters and letters <= set("ABCDE"[:n]) and len(letters) == n - 1
    assert vm.cot_letter("so D", ["o"] * 5, "A", lambda p: " d\n", rng) == ("D", " d\n")
    assert vm.parse_extracted_letter("C", 2) is None and vm.parse_extracted_letter("B.", 5) is None
