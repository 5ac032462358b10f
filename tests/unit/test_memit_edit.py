"""A single MEMIT edit on a tiny model: δ makes the model say the target, and the closed-form insertion
reproduces z = h + δ at the edit layer from the weights alone (no hook).

An untrained tiny model routes almost nothing from one position to the next, so the prompt ends with the subject
and the target is one token: the edit has to work through the subject position itself."""

import torch

from toolkit.edit.config import MemitConfig
from toolkit.edit.context import EditContext
from toolkit.edit.facts import EditRequest
from toolkit.edit.insert import insert
from toolkit.edit.keys import block_outputs, compute_keys, prompt_rows
from toolkit.edit.metrics import score_answers
from toolkit.edit.values import optimise_values


def test_single_edit_reaches_target(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    ectx = EditContext.of(model, tokenizer, "cpu", batch=4)
    request = EditRequest(prompt="The value of {}", subject="object", target_new="the", record_id="r0")
    config = MemitConfig(model="m", data="d", v_num_grad_steps=60, clamp_factor=10.0, kl_factor=0.0,
                         v_weight_decay=0.0, early_stop_loss=1e-3)
    layers, templates = [1], [""]
    before, = score_answers(model, tokenizer, [(request.text, request.target_new)], 4, "cpu")
    ectx = ectx.with_templates(templates)
    keys = compute_keys(ectx, [request], [1])[1]
    delta, h, _ = optimise_values(ectx, [request], keys, config, 1)
    width = keys.shape[-1]
    insert(ectx, [request], h + delta, layers, {l: torch.eye(width) for l in layers}, 1e-6)
    reached = block_outputs(ectx, [request], 1)
    assert torch.allclose(reached, h + delta, rtol=1e-3, atol=1e-3)
    after, = score_answers(model, tokenizer, [(request.text, request.target_new)], 4, "cpu")
    assert not before["strict"] and after["strict"]
    assert len(prompt_rows(tokenizer, [request], templates, with_target=True)[0].targets) == 1


def test_insertion_reach_is_sherman_morrison_share_of_delta():
    """One edit, one layer: the closed form moves the output by r·kᵀ(λC + kkᵀ)⁻¹k = r·s/(1+s), s = kᵀ(λC)⁻¹k,
    so a λ tuned for a wide model inserts only a small share of δ into a narrow one."""
    from toolkit.edit.insert import insertion_reach
    from toolkit.edit.solve import closed_form_update

    torch.manual_seed(3)
    d_in, d_out = 24, 10
    X = torch.randn(d_in, 500, dtype=torch.float64)
    C = X @ X.t() / 500
    k, r, h = X[:, :1] * 2, torch.randn(d_out, 1, dtype=torch.float64), torch.randn(1, d_out, dtype=torch.float64)
    shares = []
    for lam in (15000.0, 10.0, 1e-3):
        reached = h + (closed_form_update(k, r, C, lam) @ k).t()
        s = float(k.t() @ torch.linalg.solve(lam * C, k))
        share = float(insertion_reach(reached, h, r.t()))
        assert abs(share - s / (1 + s)) < 1e-9
        shares.append(share)
    assert shares[0] < 0.01 < shares[1] < shares[2] and shares[2] > 0.99


def test_handful_of_edits_reach_strict_efficacy(cli, tmp_path, tiny_gpt2_dir):
    """Regression for the 0 % benchmark: five edits on the tiny model with a text covariance. With λ scaled to
    the key width the weights produce δ and the strict metric sees every edit; the 7B-model λ = 15000 inserts
    almost nothing into 128-wide keys (reach < 10 %) and warns about it."""
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    pairs = [("object", "the"), ("list", "in"), ("module", "is"), ("string", "a"), ("function", "t")]
    for _, target in pairs:
        assert len(tokenizer(" " + target, add_special_tokens=False)["input_ids"]) == 1
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(json.dumps({"prompt": "The new name of {}", "subject": s, "target_new": t})
                               for s, t in pairs))
    common = ["edit", "memit", "-m", tiny_gpt2_dir, "-d", facts, "--steps", "25", "--json",
              "--set", f"stats_dir={tmp_path / 'stats'}", "--set", "cov_tokens=4096", "--set", "cov_seqlen=64",
              "--set", "context_prefixes=1", "--set", "prefix_tokens=3", "--set", "fluency_samples=0",
              "--set", "clamp_factor=4", "--set", "save_model=false",
              # ‖h‖ of an untrained model is tiny, so MEMIT's decay ‖δ‖/‖h‖² would pin δ at 0
              "--set", "v_weight_decay=0"]
    metrics, records, stderr = {}, {}, {}
    runs = {"50": ["--mom2-weight", "50"], "15000": ["--mom2-weight", "15000"],
            "bounded": ["--mom2-weight", "50", "--set", "clamp_factor=0.01"]}  # δ held at 1 % of ‖h‖
    for name, extra in runs.items():
        result = cli([*common, *extra, "-o", tmp_path / name])
        assert result.exit_code == 0, result.stderr  # the run completed, whether or not the edit took
        records[name] = json.loads((tmp_path / name / "run.json").read_text())
        metrics[name], stderr[name] = records[name]["metrics"], result.stderr
    assert metrics["50"]["insertion_reach"] > 0.7 and metrics["50"]["efficacy"] >= 80
    assert metrics["15000"]["insertion_reach"] < 0.1 and metrics["15000"]["efficacy"] < metrics["50"]["efficacy"]
    # the outcome check (toolkit/edit/outcome.py): said once on stderr, in run.json's warnings and verdict
    assert metrics["50"]["outcome"]["took"] and "verdict" not in records["50"]
    assert not any("did not take" in w for w in records["50"]["warnings"]) and "did not take" not in stderr["50"]
    for name in ("15000", "bounded"):
        assert not metrics[name]["outcome"]["took"] and records[name]["verdict"] == "edit did not take"
        said = [w for w in records[name]["warnings"] if w.startswith("edit did not take")]
        assert len(said) == 1 and stderr[name].count("edit did not take:") == 1
    assert "lower mom2_update_weight, now 15000" in stderr["15000"]
    bounded = metrics["bounded"]["outcome"]
    assert bounded["value_converged"] < 0.5 and bounded["delta_at_norm_bound"] == 1.0
    assert "δ ended at its norm bound ‖δ‖ ≤ 0.01·‖h‖" in stderr["bounded"] and "raise clamp_factor" in stderr["bounded"]


def test_length_groups_cover_rows_and_bound_padding():
    from toolkit.edit.keys import Row
    from toolkit.edit.values import length_groups

    lengths = [6, 27, 7, 13, 14, 9, 20, 6, 21, 11]
    rows = [Row(ids=[0] * n, subject_index=0, request=i) for i, n in enumerate(lengths)]
    picked = [0, 1, 3, 4, 6, 7, 8, 9]
    groups = length_groups(rows, picked, slack=1.25, extra=2)
    assert sorted(i for g in groups for i in g) == sorted(picked)
    for group in groups:
        sizes = [lengths[i] for i in group]
        assert max(sizes) <= 1.25 * min(sizes) + 2
    assert [[lengths[i] for i in g] for g in groups] == [[6, 6], [11, 13, 14], [20, 21, 27]]


def test_batched_values_equal_each_request_alone(tiny_llama_dir):
    """Requests optimised together (rows of many lengths, early stopping dropping some mid-way) get the δ each
    gets when optimised alone: the batch is a speed-up, not a different objective."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    facts = [("The value of {}", "object", "the"), ("{} is located in", "the big house", "a red car"),
             ("Where is {}?", "a", "blue"), ("I think {} will", "Paris France today", "of the day")]
    requests = [EditRequest(prompt=p, subject=s, target_new=t, record_id=f"r{i}") for i, (p, s, t) in enumerate(facts)]
    ectx = EditContext.of(model, tokenizer, "cpu", batch=4, templates=["", "Hello world. "])
    keys = compute_keys(ectx, requests, [1])[1]
    settings = dict(model="m", data="d", kl_factor=0.0, v_weight_decay=0.0, clamp_factor=10.0)
    start = optimise_values(ectx, requests, keys, MemitConfig(v_num_grad_steps=1, **settings), 1)[2].sort().values
    stop = float(start[:2].mean())  # the easiest request stops at once, the others keep going
    config = MemitConfig(v_num_grad_steps=12, early_stop_loss=stop, **settings)
    together, _, nll = optimise_values(ectx, requests, keys, config, 1)
    alone = torch.cat([optimise_values(ectx, [r], keys[i:i + 1], config, 1)[0] for i, r in enumerate(requests)])
    assert torch.allclose(together, alone, atol=1e-4)
    assert 1 <= int((nll < stop).sum()) < len(requests)
