"""The EAMET benchmark's validation facts (for choosing the alignment weight) are disjoint from every test set,
including the generated facts that fill N beyond the real pool, and the selection rule is the one written down."""

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "examples" / "eamet"


def _load(name):
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location(f"eamet_{name}", HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HERE))


@pytest.fixture(scope="module")
def bench():
    return _load("bench")


def _pool():
    zsre = [{"subject": f"S{i}", "src": f"Where is S{i}?", "alt": f"T{i}"} for i in range(60)]
    cf = [{"subject": f"C{i}", "prompt": f"C{i} lives in", "target_new": f"U{i}"} for i in range(40)]
    return zsre + cf


@pytest.mark.parametrize("n", [10, 70, 100, 250])
def test_validation_facts_are_in_no_test_set(bench, n):
    pool, validation = bench.split_pool(_pool(), 30)
    assert [r["subject"] for r in validation] == [f"C{i}" for i in range(10, 40)]  # the pool's tail
    tests, generated = bench.test_facts(pool, n)
    assert len(tests) == n and generated == max(0, n - 70)
    val_subjects = {r["subject"] for r in validation}
    val_prompts = {bench.prompt_of(r) for r in validation}
    for record in tests:  # neither a validation record nor a fact generated from one
        assert record["subject"] not in val_subjects and record["subject"].removesuffix(" II") not in val_subjects
        assert bench.prompt_of(record) not in val_prompts
        assert record.get("alt", record.get("target_new")) not in {f"U{i}" for i in range(10, 40)}
    bench.check_disjoint(validation, tests)


def test_overlap_is_refused(bench):
    pool = _pool()
    with pytest.raises(SystemExit, match="overlap"):
        bench.check_disjoint(pool[5:7], pool[:10])


def test_dataset_of(bench):
    assert bench.dataset_of(_pool()[0]) == "zsre" and bench.dataset_of(_pool()[-1]) == "counterfact"


def test_selection_rule_efficacy_then_spearman():
    select = _load("select_weight")
    rows = [{"method": "MEMIT", "efficacy": 90.0, "alignment_spearman": 0.0, "scale": None},
            {"method": "EAMET", "efficacy": 70.0, "alignment_spearman": 0.1, "scale": 0.001},
            {"method": "EAMET", "efficacy": 70.0, "alignment_spearman": 0.2, "scale": 0.01},
            {"method": "EAMET", "efficacy": 40.0, "alignment_spearman": 0.7, "scale": 1.0}]
    assert select.choose(rows)["scale"] == 0.01  # MEMIT is a reference, never chosen


@pytest.mark.parametrize("dataset,n", [("counterfact", 5), ("zsre", 20), ("pool", 65)])
def test_one_dataset_test_sets_stay_disjoint_from_validation(bench, tmp_path, monkeypatch, dataset, n):
    """DATASET=counterfact / zsre draws the test facts from that dataset's part of the test pool only (the CounterFact
    rows of issue 27), never from the validation tail."""
    monkeypatch.setattr(bench, "real_pool", _pool)
    monkeypatch.setattr(bench, "OUT", tmp_path)
    path, generated, counts = bench.facts_file(n, dataset)
    records = [__import__("json").loads(line) for line in path.read_text().splitlines()]
    assert len(records) == n and generated == 0
    if dataset == "pool":
        assert counts == {"zsre": 60, "counterfact": 5} and path.name == f"facts-{n}.jsonl"
    else:
        assert counts[dataset] == n and {bench.dataset_of(r) for r in records} == {dataset}
        assert path.name == f"facts-{dataset}-{n}.jsonl"
    if dataset == "counterfact":  # CounterFact's test part is C0..C9 (C10..C39 are validation)
        assert [r["subject"] for r in records] == [f"C{i}" for i in range(5)]
