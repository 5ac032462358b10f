"""The PRISM benchmark's matched-utility rule and its VerbMem windows (examples/prism/bench.py)."""

from pathlib import Path

import pytest
from testkit import load_script

BENCH = Path(__file__).resolve().parents[2] / "examples" / "prism" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH, "prism_bench")


def test_choose_takes_the_strongest_setting_within_the_utility_tolerance(bench):
    points = [{"lr": 1e-4, "knowmem_retain": 40.0}, {"lr": 2e-4, "knowmem_retain": 38.5},
              {"lr": 5e-4, "knowmem_retain": 30.0}]
    chosen = bench.choose(points, original_knowmem_retain=40.0, tolerance=0.05)
    assert chosen["lr"] == 2e-4 and chosen["matched_utility"]  # 38.5 >= 0.95*40 = 38; 30 is not


def test_choose_flags_an_unmatched_fallback_closest_to_the_original(bench):
    points = [{"lr": 1e-4, "knowmem_retain": 10.0}, {"lr": 2e-4, "knowmem_retain": 10.0},
              {"lr": 5e-4, "knowmem_retain": 0.0}]
    chosen = bench.choose(points, original_knowmem_retain=40.0, tolerance=0.05)
    assert chosen["lr"] == 1e-4 and not chosen["matched_utility"]


def test_verbmem_windows_start_every_prompt_at_the_article_start(bench, tiny_tokenizer):
    text = " ".join(f"w{i}" for i in range(200))
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    items = bench.verbmem_windows(tiny_tokenizer, [text, text], prompt_tokens=8, gt_tokens=6, stride=4)
    per_article = len(range(8, len(ids) - 6 + 1, 4))
    assert len(items) == 2 * per_article and {r["article"] for r in items} == {0, 1}
    for k, item in enumerate(items[:per_article]):
        cut = 8 + 4 * k
        assert item["prompt"] == tiny_tokenizer.decode(ids[:cut])
        assert item["gt"] == tiny_tokenizer.decode(ids[cut:cut + 6])
