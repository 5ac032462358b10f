"""Did the edit take? An edit checks its own outcome, because a run can finish cleanly and change nothing.

An edit takes in three stages, each of which can fail on its own, and each leaves a number behind:
1. values: the optimised δ makes the model say the new object at the last edit layer (the final target NLL of the
   value optimisation). It fails when δ hits its norm bound (`clamp`·‖h‖ for MEMIT, ‖k‖ for EAMET's fix_ks: EAMET's
   2·‖k‖ was tuned on 7B models, where ‖k‖ is large next to ‖h‖; on SmolLM2-135M ‖k‖ ≈ 7 against ‖h‖ ≈ 100, so δ
   is bounded to a seventh of MEMIT's and the NLL stalls), or when the steps run out.
2. insertion: the closed-form update reproduces δ from the weights (`insertion_reach`; λ too large for the model's
   width inserts only a small share; far above 1 the update overshoots: the closed form is linear, and what lies
   between the edited projection and the z layer is not. A post-norm on the projection's output (Gemma 2/3's
   post-feedforward RMSNorm) is modelled by its pre-image (toolkit.edit.insert); before that, Gemma 3 270M reached
   216 % of δ).
3. effect: the edited model says the new object on the rewrite prompts (strict efficacy), more often than the
   unedited model did.
`assess` judges the effect (stage 3) and, when it failed, names the stage that did (1, 2 or neither), and `report` states it once: one warning line on
stderr that run.json also records (`warnings`), `metrics.outcome`, and the run's verdict (the summary's title).
The run itself completed: the exit code stays 0.
"""

from __future__ import annotations

import torch

VALUE_NLL_OK = 0.5  # a fact's value optimisation converged when its final mean target-token NLL is below this
VALUE_SHARE_OK = 0.5  # ... on at least this share of the facts
REACH_OK = 0.5  # the weights produce at least this share of δ (insertion_reach)
REACH_HIGH = 1.5  # ... and not more than this: an overshoot means the closed form's linear picture does not hold
EFFICACY_OK = 50.0  # strict efficacy (%) after the edit
BOUND_SLACK = 0.99  # ‖δ‖ at or above this share of its bound counts as "at the bound"


def norm_bound(config, h: torch.Tensor, keys_z: torch.Tensor) -> torch.Tensor:
    """Per fact: the bound the value optimisation projects ‖δ‖ onto (values._optimise_chunk's max_norm)."""
    base = h if config.clamp == "h" else keys_z
    return config.clamp_factor * base.float().norm(dim=-1)


def assess(*, nll: torch.Tensor, delta: torch.Tensor, bound: torch.Tensor, insertion_reach: float,
           efficacy: float, efficacy_before: float | None, clamp: str, clamp_factor: float,
           mom2_update_weight: float | None = None) -> dict:
    """The outcome of one edit run: {took, reasons, value_converged, delta_at_norm_bound, ...}.

    The verdict is the effect (strict efficacy at least EFFICACY_OK and above the unedited model's); when it fails,
    the reasons say which stage failed: the values (too few converged; at δ's norm bound or out of steps), the
    insertion (reach), or neither (the change at the edit layers does not carry to the rewrite prompts)."""
    n = int(nll.numel())
    converged = nll < VALUE_NLL_OK
    at_bound = delta.float().norm(dim=-1) >= BOUND_SLACK * bound
    stalled = ~converged
    share = float(converged.float().mean()) if n else 1.0
    took = efficacy >= EFFICACY_OK and (efficacy_before is None or efficacy > efficacy_before)
    reasons = []
    if not took:
        before = f" (unedited {efficacy_before:.1f}%)" if efficacy_before is not None else ""
        reasons.append(f"efficacy {efficacy:.1f}%{before}")
        if share < VALUE_SHARE_OK:
            reason = (f"the value optimisation converged on {int(converged.sum())}/{n} facts (mean target NLL "
                      f"{float(nll.mean()):.3g}, converged below {VALUE_NLL_OK})")
            bounded = int((at_bound & stalled).sum())
            if bounded * 2 >= int(stalled.sum()):
                base = "‖h‖" if clamp == "h" else "‖k‖"
                reason += (f": δ ended at its norm bound ‖δ‖ ≤ {clamp_factor:g}·{base} on {bounded} of the "
                           f"{int(stalled.sum())} others (raise clamp_factor)")
            else:
                reason += ": more value steps (--steps) or a larger v_lr"
            reasons.append(reason)
        if insertion_reach < REACH_OK:
            lam = f", now {mom2_update_weight:g}" if mom2_update_weight is not None else ""
            reasons.append(f"the edited weights produce only {100 * insertion_reach:.0f}% of δ (lower "
                           f"mom2_update_weight{lam})")
        elif insertion_reach > REACH_HIGH:
            reasons.append(f"the edited weights move the edit layer's output by {100 * insertion_reach:.0f}% of δ: "
                           "the closed form's linear picture of the edited projection's effect on the residual "
                           "stream does not hold here (a post-norm it does not know of, or δ large next to the "
                           "branch output a post-norm bounds)")
        if len(reasons) == 1:
            reasons.append(f"the values converged ({100 * share:.0f}%) and the weights produce "
                           f"{100 * insertion_reach:.0f}% of δ, yet the rewrite prompts do not follow (other layers?)")
    return {"took": took, "reasons": reasons, "value_converged": round(share, 4),
            "delta_at_norm_bound": round(float(at_bound.float().mean()), 4) if n else 0.0,
            "insertion_reach": round(insertion_reach, 4),
            "efficacy_gain": round(efficacy - efficacy_before, 2) if efficacy_before is not None else None,
            "thresholds": {"value_nll": VALUE_NLL_OK, "value_share": VALUE_SHARE_OK, "insertion_reach": REACH_OK,
                           "insertion_reach_high": REACH_HIGH, "efficacy": EFFICACY_OK}}


def check_edit(ctx, config, metrics: dict, *, nll: torch.Tensor, delta: torch.Tensor, h: torch.Tensor,
               keys_z: torch.Tensor) -> dict:
    """Assess the finished edit, record it in metrics["outcome"], and warn once (stderr + run.json) if it did
    not take; the verdict goes to the run record's summary."""
    before = (ctx.baselines.get("unedited") or {}).get("efficacy")
    outcome = assess(nll=nll.detach().cpu(), delta=delta.detach().cpu(),
                     bound=norm_bound(config, h.detach().cpu(), keys_z.detach().cpu()),
                     insertion_reach=float(metrics.get("insertion_reach", 1.0)),
                     efficacy=float(metrics["efficacy"]), efficacy_before=before,
                     clamp=config.clamp, clamp_factor=config.clamp_factor,
                     mom2_update_weight=config.mom2_update_weight)
    metrics["outcome"] = outcome
    if not outcome["took"]:
        message = "edit did not take: " + "; ".join(outcome["reasons"])
        ctx.warn(message)
        ctx.verdict = "edit did not take"
    return outcome
