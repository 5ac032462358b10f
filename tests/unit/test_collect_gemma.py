"""examples/models/collect_gemma.py: --keep never drops committed rows whose runs are gone, a re-measured row
replaces its old one in place, and the generated block of examples/models/RESULTS.md is rendered from the rows."""

from pathlib import Path

from testkit import load_script

ROOT = Path(__file__).resolve().parents[2]
COLLECT = load_script(ROOT / "examples" / "models" / "collect_gemma.py", "collect_gemma")


def test_keep_adds_and_replaces_never_drops():
    old = [{"run": "runs/gemma/a", "efficacy": 1}, {"model": "m", "setting": "w4", "method": "gptq", "ppl": 9},
           {"run": "runs/gemma/b", "efficacy": 2}]
    new = [{"run": "runs/gemma/b", "efficacy": 3}, {"run": "runs/gemma/c", "efficacy": 4}]
    assert COLLECT._combined(old, new, keep=False) == new
    assert COLLECT._combined(old, new, keep=True) == [old[0], old[1], new[0], new[1]]


def test_the_block_is_rendered_from_the_rows(tmp_path):
    edits = [{"method": "MEMIT", "n_edits": 10, "efficacy": 90.0, "commit": "x"},  # < 100 facts: not in the table
             {"method": "EAMET", "n_edits": 100, "mom2_update_weight": 10.0, "clamp": "ks", "clamp_factor": 10.0,
              "efficacy": 61.0, "generalization": 40.0, "specificity": 2.0, "fluency": 5.4321,
              "unedited": {"efficacy": 1.0, "generalization": 2.0, "fluency": 5.5}, "value_nll": 0.25,
              "insertion_reach": 0.9, "alignment_spearman": 0.82, "outcome": {"took": True}, "process_cpu_seconds": 1234.4, "commit": "abc1234"}]
    gguf = {"llama_cpp_python": "0.3.36", "rows": [
        {"model": "gemma3-270m [obr]", "status": "ok", "commit": "def5678",
         "vs_packed": {"top1_agreement": 1.0, "greedy_agreement": 0.75, "max_abs_logit_diff": 1.48,
                       "max_rel_logit_diff": 0.056, "reference_top2_margin_where_greedy_splits": [0.04]}},
        {"model": "llama", "status": "ok", "vs_packed": {}}]}
    block = COLLECT.render_block(edits, gguf)
    lines = block.splitlines()
    assert lines[0] == COLLECT.BEGIN and lines[-1] == COLLECT.END
    assert "| EAMET | 100 | 10.0 | 10.0·‖ks‖ | 61.0 | 40.0 | 2.0 | 5.432 | 1.0 / 2.0 / 5.500 | 0.250 | 0.90 | 0.82 | took | " \
           "1234 | abc1234 |" in lines
    assert not any(line.startswith("| MEMIT | 10 ") for line in lines)
    assert "| gemma3-270m [obr] | 100.0% | 75.0% | 1.48 (5.6%) | 0.04 | def5678 |" in lines
    target = tmp_path / "RESULTS.md"
    target.write_text("# title\n\nprose\n")
    COLLECT.write_block(target, block)
    COLLECT.write_block(target, block)  # idempotent: the block is replaced, not appended again
    assert target.read_text().count(COLLECT.BEGIN) == 1 and target.read_text().startswith("# title\n\nprose\n")
