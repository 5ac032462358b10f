"""The edit's own outcome check (toolkit/edit/outcome.py) on the numbers each failure leaves: a value optimisation
stalled at δ's norm bound (EAMET's 2·‖k‖ on SmolLM2), one that ran out of steps, an insertion λ too large, an
efficacy that did not move (MEMIT on Gemma 3 before the block-type fix), and an edit that took."""

import torch

from toolkit.edit.config import EametConfig, MemitConfig
from toolkit.edit.outcome import assess, norm_bound


def _assess(nll, norms, bound=10.0, reach=0.9, efficacy=90.0, before=0.0, clamp="h", factor=0.75):
    delta = torch.zeros(len(norms), 4)
    delta[:, 0] = torch.tensor(norms)
    return assess(nll=torch.tensor(nll), delta=delta, bound=torch.full((len(norms),), bound), insertion_reach=reach,
                  efficacy=efficacy, efficacy_before=before, clamp=clamp, clamp_factor=factor)


def test_an_edit_that_took():
    out = _assess([0.02, 0.04, 0.9], [3.0, 4.0, 10.0])
    assert out["took"] and out["reasons"] == [] and out["value_converged"] == round(2 / 3, 4)
    assert out["efficacy_gain"] == 90.0 and out["delta_at_norm_bound"] == round(1 / 3, 4)


def test_values_stalled_at_the_norm_bound_name_the_clamp():
    out = _assess([13.9, 4.0, 0.01], [10.0, 9.995, 2.0], efficacy=0.0, clamp="ks", factor=2.0)
    assert not out["took"]
    efficacy, value = out["reasons"]
    assert "converged on 1/3 facts" in value and "‖δ‖ ≤ 2·‖k‖ on 2 of the 2 others (raise clamp_factor)" in value
    assert efficacy == "efficacy 0.0% (unedited 0.0%)"


def test_values_that_ran_out_of_steps_ask_for_steps():
    out = _assess([3.0, 2.0], [1.0, 2.0], efficacy=0.0)
    assert "--steps" in out["reasons"][1] and "norm bound" not in out["reasons"][1]


def test_low_reach_and_an_efficacy_that_did_not_move():
    out = _assess([0.01, 0.02], [1.0, 1.0], reach=0.05, efficacy=10.0, before=10.0)
    assert [r.split(" ")[1] for r in out["reasons"]] == ["10.0%", "edited"]
    assert not out["took"] and out["efficacy_gain"] == 0.0
    # above the threshold but not above the unedited model: still did not take
    assert not _assess([0.01], [1.0], efficacy=60.0, before=60.0)["took"]
    assert _assess([0.01], [1.0], efficacy=60.0, before=None)["took"]


def test_norm_bound_follows_the_clamp():
    h, k = torch.tensor([[3.0, 4.0]]), torch.tensor([[6.0, 8.0, 0.0]])
    assert float(norm_bound(MemitConfig(model="m", data="d"), h, k)) == 0.75 * 5
    assert float(norm_bound(EametConfig(model="m", data="d"), h, k)) == 2.0 * 10


def test_the_effect_decides_and_the_stages_explain():
    """Argmax-right answers with a target NLL above the threshold took; a failed effect with both stages fine
    says so rather than blaming either."""
    took = _assess([0.9, 1.2], [1.0, 1.0], efficacy=80.0)
    assert took["took"] and took["reasons"] == [] and took["value_converged"] == 0.0
    odd = _assess([0.01, 0.02], [1.0, 1.0], efficacy=20.0)
    assert not odd["took"] and "yet the rewrite prompts do not follow" in odd["reasons"][1]


def test_an_overshooting_insertion_names_the_nonlinearity():
    """MEMIT on Gemma 3 270M after the block-type fix, before the post-norm pre-image: values converged, reach 2.16,
    efficacy 20 %."""
    out = _assess([0.3, 0.4], [1.0, 1.0], reach=2.16, efficacy=20.0)
    assert not out["took"] and "216% of δ" in out["reasons"][1] and "post-norm" in out["reasons"][1]
