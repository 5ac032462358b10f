"""`iclrkit edit memit` on every decoder family the adapters support (tiny random-weight models built here,
Gemma3ForConditionalGeneration with its blocks under model.language_model included): the run succeeds, it changes
exactly the edit layers' MLP down-projections the ModelView names, each target's log-probability goes up, and the
saved model loads and still runs."""

import json

import pytest
import torch
from tiny_models import FAMILIES, build_family

FACTS = [("The new name of {}", "object", "the"), ("The new name of {}", "list", "in")]
FAST = ["--steps", "8", "--mom2-weight", "1", "--set", "cov_tokens=256", "--set", "cov_seqlen=32",
        "--set", "context_prefixes=1", "--set", "prefix_tokens=3", "--set", "fluency_samples=0",
        "--set", "clamp_factor=4", "--set", "v_weight_decay=0", "--set", "kl_factor=0"]


@pytest.mark.parametrize("family", FAMILIES)
def test_memit_edits_every_family(cli, tiny_tokenizer, tmp_path, family):
    from toolkit.models.view import view_of
    from toolkit.models.source import load_model

    torch.manual_seed(0)
    source = tmp_path / "src"
    build_family(family, len(tiny_tokenizer)).save_pretrained(source)
    tiny_tokenizer.save_pretrained(source)
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(json.dumps({"prompt": p, "subject": s, "target_new": t}) for p, s, t in FACTS))
    out = tmp_path / "out"
    result = cli(["edit", "memit", "-m", source, "-d", facts, "-o", out, "--set", f"stats_dir={tmp_path / 'stats'}",
                  *FAST])
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "ok" and record["metrics"]["layers"] == [0, 1]
    assert not (out / "metrics.json").exists()  # the run record is run.json alone

    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["post"]["logp_new"] > row["pre"]["logp_new"] + 0.05, (family, row)

    original, _ = load_model(str(source), "cpu", None)
    edited, tokenizer = load_model(str(out / "model"), "cpu", None)
    view = view_of(edited)
    before, after = original.state_dict(), edited.state_dict()
    changed = {name for name in after if not torch.equal(after[name], before[name])}
    assert changed == {f"{view.full_name(layer, view.mlp_out(layer))}.weight" for layer in (0, 1)}
    ids = torch.tensor([tokenizer("The new name of object")["input_ids"]])
    with torch.no_grad():
        logits = edited(input_ids=ids).logits
    assert logits.shape[-1] >= len(tiny_tokenizer) and torch.isfinite(logits).all()
