"""Per technique: the one-line status, the extra checks beyond the benchmark target, and the headline tables that
scripts/render_results.py writes into README.md and examples/NAME/RESULTS.md. Every figure comes from the committed
results files through `load(name, file)`; nothing here holds a number of its own except the targets.

A claim's line names its best figure against its strongest fair baseline and the verdict; headline rows are the
paper's method (chosen on validation data where a choice was made) — a row chosen on test data is labelled so.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Callable

from results_gates import gate, method_row, node_ratios, norm

PAPER_FORMULATIONS = ("one", "inf", "multi")  # k-HC: the paper's strengthened formulations (inf+tight is ours)


@dataclass
class Claim:
    ok: bool
    line: str  # the claim's best figure against its strongest fair baseline, and the verdict


@dataclass
class Report:
    """What one technique publishes: its checks, its status line and its headline tables."""
    gate: tuple[bool, str] | None
    claims: list[Claim]
    summary: str  # the status line when every check holds
    tables: list[tuple[str, list[str], list[list[str]], list[dict]]] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)  # records the verdict reads

    @property
    def unverified(self) -> list[dict]:
        seen = {id(r): r for r in self.records + [r for t in self.tables for r in t[3]]}
        return [r for r in seen.values() if r.get("transcribed")]

    @property
    def done(self) -> bool:
        return ((self.gate is None or self.gate[0]) and all(c.ok for c in self.claims)
                and not any(r.get("transcribed") for r in self.records))

    @property
    def status(self) -> str:
        return "done" if self.done else "built"

    @property
    def line(self) -> str:
        failing = [c for c in self.claims if not c.ok]
        if failing:
            return failing[0].line
        if self.gate is not None and not self.gate[0]:
            return f"target not met: {self.gate[1]}"
        if any(r.get("transcribed") for r in self.records):
            return f"{self.summary}; rows transcribed, not re-run by a repro: unverified"
        return self.summary


@dataclass
class Technique:
    name: str
    task: str
    command: str
    build: Callable
    what: str = ""

    def report(self, load) -> Report:
        return self.build(load)


# ------------------------------------------------------------------------------------------------ formatting

def f(x, nd: int = 2) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return f"{x:.{nd}f}"
    return str(x)


def pm(mean, sd, nd: int = 2) -> str:
    return f(mean, nd) if sd is None else f"{mean:.{nd}f} ± {sd:.{nd}f}"


def pct(x, nd: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{nd}f}%"


def mark(r: dict, text: str) -> str:
    """A cell text, with † when its row is transcribed (unverified)."""
    return f"{text} †" if r.get("transcribed") else text


def verdict_vs(ours: float, ours_sd, base: float, base_sd, lower_is_better: bool) -> str:
    """'beyond the seed sd' / 'direction holds, not beyond the seed sd' / 'baseline ahead'."""
    sign = -1 if lower_is_better else 1
    if sign * (ours - base) <= 0:
        return "baseline ahead"
    if ours_sd is None or base_sd is None:
        return "ahead (one seed)"
    apart = sign * (ours - base) > (ours_sd + base_sd)
    return "beyond both seed sds" if apart else "direction holds, not beyond the seed sd"


def sd_of(xs):
    return statistics.stdev(xs) if len(xs) > 1 else None


# ------------------------------------------------------------------------------------------------ compress

def obr(load) -> Report:
    d = load("obr")
    rows, seed_rows = d["rows"], d.get("seed_rows", [])
    smol = [r for r in rows if r.get("model") == "smollm2-135m"]
    ob = method_row(smol, "OBR_GPTQ", setting="w4a16-s50")
    peer = method_row(smol, "llm-compressor SparseGPT->GPTQ two-stage", setting="w4a16-s50")
    def calibrated_32x512(r):  # rows that name another calibration size (16x256, ...) belong elsewhere
        size = re.search(r"\d+x\d+", str(r.get("calibration", "")))
        return size is None or size.group(0) == "32x512"

    a_rows = [r for r in smol if (r.get("setting") == "w4a16-s50" or norm(r.get("method")) == "fpdense")
              and r.get("ppl") is not None and calibrated_32x512(r)]
    table_a = [[mark(r, r.get("method", "–")), f(r.get("rotate")), f(r["ppl"]), f(r.get("seconds"), 0),
                pct(r.get("sparsity")), r.get("commit", "–")] for r in a_rows]
    claims = []
    if ob and peer:
        ok = ob["ppl"] < peer["ppl"] and ob["seconds"] < peer["seconds"]
        claims.append(Claim(ok, f"OBR_GPTQ {ob['ppl']:.2f} ppl / {ob['seconds']:.0f} s vs llm-compressor "
                                f"SparseGPT→GPTQ {peer['ppl']:.2f} / {peer['seconds']:.0f} s (SmolLM2 W4A16 + 50% "
                                f"sparsity, 32×512 calibration, one seed): "
                                + ("OBR ahead on both" if ok else "the peer is ahead")))
    means = [r for r in seed_rows if r.get("seed") == "mean" and r.get("ppl_mean") is not None]
    table_b, verdicts, seed_ok = [], [], True
    for setting in sorted({r["setting"] for r in means}):
        here = [r for r in means if r["setting"] == setting]
        o = next((r for r in here if r["method"] == "OBR_GPTQ"), None)
        bases = [r for r in here if norm(r["method"]).startswith("sparsegptgptqtwostage") and r.get("ppl_sd")]
        for r in here:
            table_b.append([setting, mark(r, r["method"]), pm(r["ppl_mean"], r.get("ppl_sd")),
                            f(r.get("seconds_mean"), 0), str(r.get("seeds"))])
        if o and bases:
            b = min(bases, key=lambda r: r["ppl_mean"])
            v = verdict_vs(o["ppl_mean"], o.get("ppl_sd"), b["ppl_mean"], b.get("ppl_sd"), lower_is_better=True)
            seed_ok &= v.startswith("beyond")
            verdicts.append(f"{setting} OBR {o['ppl_mean']:.2f} ± {o['ppl_sd']:.2f} vs {b['method']} "
                            f"{b['ppl_mean']:.2f} ± {b['ppl_sd']:.2f}: {v}")
    if verdicts:
        claims.append(Claim(seed_ok, "over 3 calibration seeds (16×256), OBR_GPTQ vs our strongest two-stage: "
                            + "; ".join(verdicts)))
    pairs = [r for r in smol if r.get("method") in ("GPTQ", "llm-compressor GPTQ") and r.get("cpu_seconds")
             and "pair only" in str(r.get("load", ""))]
    peer_cpu = {r.get("commit"): r["cpu_seconds"] for r in pairs if r["method"] == "llm-compressor GPTQ"}
    table_c = [[mark(r, r["method"]), f(r.get("rotate")), r.get("w_clip_search") or "–", f(r["ppl"]),
                f(r["cpu_seconds"], 1),
                f(r["cpu_seconds"] / peer_cpu[r.get("commit")]) + "x" if r.get("commit") in peer_cpu else "–",
                r.get("commit", "–")] for r in pairs]
    summary = claims[0].line if claims else "no SmolLM2 OBR row"
    return Report(gate("obr", load), claims, summary, [
        ("SmolLM2-135M, W4A16 + 50% sparsity, 32×512 calibration tokens of WikiText-2 valid, one seed (wall seconds "
         "on a shared machine)", ["method", "rotated", "ppl", "seconds", "sparsity", "commit"], table_a, a_rows),
        ("Three calibration seeds (16×256), mean ± sd", ["setting", "method", "ppl", "seconds", "seeds"], table_b,
         means),
        ("GPTQ W4A16 per channel vs llm-compressor's GPTQ, clean pairs (one thread each, nothing else running); CPU "
         "seconds against the peer's run at the same commit",
         ["method", "rotated", "clip search", "ppl", "CPU s", "vs peer CPU s", "commit"], table_c, pairs),
    ], [r for r in (ob, peer) if r] + means)


def int4(load) -> Report:
    d = load("int4")
    rows, m = d["rows"], d["model"]
    table = [[r["kernel"], str(r["m"]), f"{r['n']}×{r['k']}", f(r["ms"], 3), f(r["fp32_ms"], 3),
              f(r["speedup_vs_fp32"]) + "x"] for r in rows]
    dense = [r for r in rows if "sparse" not in r["kernel"]]
    summary = (f"dense INT4 GEMM {min(r['speedup_vs_fp32'] for r in dense):.1f}x FP32 at 4096×4096 (CPU, W4A8); "
               f"packed 2:4 model {m['packed_mb']:.2f} MB vs {m['fp32_mb']:.1f} MB FP32 "
               f"({m['packed_mb'] / m['fp32_mb']:.2f}x, target 0.2x)")
    model_rows = [["size on disk MB", f(m["fp32_mb"]), f(m["packed_mb"])],
                  ["decode tokens/s", f(m["decode_tokens_per_s_fp32"]), f(m["decode_tokens_per_s_packed"])],
                  ["prefill ms", f(m["prefill_ms_fp32"]), f(m["prefill_ms_packed"])],
                  ["max |logit gap| vs FP32", "–", f(m["max_abs_logit_gap_vs_fp32"], 4)]]
    return Report(gate("int4", load), [], summary, [
        ("Kernels vs torch FP32 (best of N, interleaved)", ["kernel", "m", "n×k", "ms", "FP32 ms", "speed-up"],
         table, rows),
        ("OBR 2:4-packed llama-small on the kernels", ["", "FP32", "packed INT4"], model_rows, [d]),
    ], rows + [d])


# ------------------------------------------------------------------------------------------------ edit, unlearn

def eamet(load) -> Report:
    rows = load("eamet")["rows"]
    head = [r for r in rows if r.get("code") == "issue-27"]
    old = [r for r in rows if r.get("code") != "issue-27"]
    table_a = [[r["dataset"], str(r["n_edits"]), mark(r, r["method"] + (f" (×{r['alignment_scale']:g})"
                                                                        if r.get("alignment_scale") else "")),
                f(r["efficacy"], 1), f(r.get("generalization"), 1), f(r.get("specificity"), 1),
                f(r.get("specificity_zsre_per_token")), f(r.get("alignment_spearman"), 3)] for r in head]
    table_b = [[r["model"], str(r["n_edits"]), mark(r, r["method"]), f(r["efficacy"], 1),
                f(r.get("specificity"), 1)] for r in old]
    parts, ok = [], True
    for ds in sorted({r["dataset"] for r in head}, key=lambda s: s != "zsre"):
        me = method_row([r for r in head if r["dataset"] == ds], "memit")
        ea = method_row([r for r in head if r["dataset"] == ds], "eamet")
        if me and ea and me["efficacy"] < 90:
            ok &= ea["efficacy"] >= me["efficacy"] + 5
            label = {"zsre": "zsRE", "counterfact": "CounterFact"}.get(ds, ds)
            parts.append(f"{label} {ea['n_edits']} edits EAMET {ea['efficacy']:.1f} vs MEMIT {me['efficacy']:.1f}")
    claims = [Claim(ok, "strict efficacy on SmolLM2, alignment weight chosen on held-out validation facts: "
                    + "; ".join(parts) + (": EAMET ≥ MEMIT + 5 holds" if ok else ": reversed (target EAMET ≥ "
                                          "MEMIT + 5)"))] if parts else []
    return Report(gate("eamet", load), claims, claims[0].line if claims else "no current-code rows", [
        ("Current code (sequential alignment, per-type key means, 100k-token covariance), SmolLM2-135M, %",
         ["dataset", "N", "method", "efficacy", "generalization", "specificity", "zsRE neighbourhood per token",
          "key–δ Spearman"], table_a, head),
        ("Earlier code (chunked alignment, one bare template), the rows the benchmark target also reads, %; "
         "the ×0.01 weight was chosen on records 500–529, inside the N = 1000 test set",
         ["model", "N", "method", "efficacy", "specificity"], table_b, old),
    ], rows)


def prism(load) -> Report:
    rows = load("prism")["rows"]
    shown = [r for r in rows if " seed " not in r["method"]]
    table = []
    for r in shown:
        per = [x["verbmem_after_relearn"] for x in rows if x["method"].startswith(r["method"] + " seed ")]
        relearn = pm(r.get("verbmem_after_relearn"), r.get("verbmem_after_relearn_sd")) \
            if r.get("verbmem_after_relearn") is not None else "–"
        seeds = r.get("seeds", r.get("seed"))
        table.append([mark(r, r["method"]), f(r.get("lr"), 4) if r.get("lr") else "–", str(seeds),
                      f(r.get("verbmem_forget")), f(r.get("knowmem_forget")), f(r.get("knowmem_retain")),
                      f(r.get("utility_ppl")), relearn, " / ".join(f(x) for x in per) or "–",
                      f(r.get("verbmem_embed_attack"))])
    pr, npo = method_row(rows, "prism"), method_row(rows, "npo")
    claims = []
    if pr and npo:
        p, n = pr["verbmem_after_relearn"], npo["verbmem_after_relearn"]
        psd, nsd = pr.get("verbmem_after_relearn_sd"), npo.get("verbmem_after_relearn_sd")
        v = verdict_vs(p, psd, n, nsd, lower_is_better=True)
        k = len(pr["seeds"]) if isinstance(pr.get("seeds"), list) else pr.get("seeds", 1)
        claims.append(Claim(p <= n - 5, f"PRISM {pm(p, psd, 1)} vs NPO {pm(n, nsd, 1)} relearn VerbMem ({k} seeds, "
                                        f"matched utility): {v} (target PRISM ≤ NPO − 5)"))
    return Report(gate("prism", load), claims, claims[0].line if claims else "no PRISM row", [
        ("Matched utility, gradient clipping at 1.0 (VerbMem/KnowMem in %, lower is better except KnowMem R)",
         ["method", "lr", "seeds", "VerbMem F", "KnowMem F", "KnowMem R", "utility ppl", "VerbMem after relearn",
          "per seed", "embedding attack"], table, shown),
    ], [r for r in (pr, npo) if r])


def steer(load) -> Report:
    d = load("steer")
    rows = d["rows"]
    table = [[r["method"].upper(), str(r["layer"]), f(r["alpha"], 1), r.get("operator", "add"),
              "held-out" if r.get("eval_prompts") == "heldout" else "selection (in-sample)",
              pct(r["category_prob_drop"]), f(r["neutral_kl"], 3), f(r["neutral_ppl_ratio"], 3),
              f(r["split_half_cosine"], 3)] for r in rows]
    held = [r for r in rows if r["method"] == "pcms" and r.get("eval_prompts") == "heldout"]
    insample = [r for r in rows if r["method"] == "pcms" and r.get("eval_prompts") != "heldout"
                and r["neutral_kl"] <= 0.05]
    claims = []
    if held:
        ok_rows = [r for r in held if r["neutral_kl"] <= 0.05]
        best = max(ok_rows or held, key=lambda r: r["category_prob_drop"])
        best_in = max(insample, key=lambda r: r["category_prob_drop"]) if insample else None
        ok = best["category_prob_drop"] >= 0.5 and best["neutral_kl"] <= 0.05
        claims.append(Claim(ok, f"PCMS cuts P(category) by {pct(best['category_prob_drop'])} at neutral KL "
                                f"{best['neutral_kl']:.3f} on held-out prompts (target 50% at KL ≤ 0.05)"
                                + (f"; {pct(best_in['category_prob_drop'])} on the prompts the setting was chosen on"
                                   if best_in else "")))
    pc = max((r["split_half_cosine"] for r in rows if r["method"] == "pcms"), default=None)
    um = max((r["split_half_cosine"] for r in rows if r["method"] == "ums"), default=None)
    summary = claims[0].line if claims else "no held-out row"
    if pc is not None and um is not None:
        claims.append(Claim(pc > um, f"split-half stability PCMS {pc:.3f} vs UMS {um:.3f}"))
    return Report(gate("steer", load), claims, summary, [
        (f"{d.get('model')}, category {d.get('category')}: P(category) drop by the MiniLM judge, neutral KL and "
         "perplexity ratio, split-half cosine of the direction",
         ["method", "layer", "α", "operator", "prompts", "drop", "neutral KL", "ppl ratio", "split-half cos"],
         table, rows),
    ], rows)


def backdoor(load) -> Report:
    d = load("backdoor")
    ab = d.get("ablation_real_rows", {})
    keys = [("ASR before defense", "asr_before"), ("ASR after X-GRAAD", "asr_after"),
            ("clean accuracy before", "cacc_before"), ("clean accuracy after", "cacc_after"),
            ("trigger is the top-scored token", "trigger_top1_rate"),
            ("clean inputs over the threshold", "clean_over_threshold_rate"),
            ("clean inputs flagged", "clean_flag_rate"), ("poisoned inputs flagged", "poison_detect_rate")]
    table = [[label, f(d.get(k), 3), f(ab.get(k), 3)] for label, k in keys]
    table += [["ASR with STRIP (5% clean rejection budget)", f(d["asr_strip"], 3), "–"],
              ["ASR after ONION (zoo:gpt2-small)", f(d["asr_onion"], 3), "–"],
              ["ONION clean accuracy (subset of " + str(d.get("onion", {}).get("cacc_subset_n")) + ")",
               f(d.get("onion", {}).get("cacc_subset"), 3), "–"]]
    drop = 100 * (d["cacc_before"] - d["cacc_after"])
    summary = (f"ASR {d['asr_before']:.3f} → {d['asr_after']:.3f} after X-GRAAD vs STRIP {d['asr_strip']:.3f} and "
               f"ONION {d['asr_onion']:.3f}; clean accuracy −{drop:.2f} points (limit 2); trigger top-1 "
               f"{d['trigger_top1_rate']:.3f}")
    return Report(gate("backdoor", load), [], summary, [
        (f"BadNets MiniLM victim, {d.get('n_clean')} clean / {d.get('n_poisoned')} poisoned SST-2 dev sentences",
         ["metric", "X-GRAAD (padding rows counted, official)", "ablation: real rows only"], table, [d]),
    ], [d])


# ------------------------------------------------------------------------------------------------ explain

def fame(load) -> Report:
    rows = load("fame")["rows"]
    table = [[r["model"], mark(r, r["method"]), str(r["n_images"]), f(r["mean_size"]), f(r["mean_seconds"], 3),
              f(r.get("mean_dist_to_minimal")), f(r.get("mean_size_min")), f(r.get("verified_fraction"))]
             for r in rows]
    parts = []
    for model in sorted({r["model"] for r in rows}):
        fa, vx = method_row(rows, "fame", model=model), method_row(rows, "verix", model=model)
        if fa and vx:
            parts.append(f"{model} size {fa['mean_size']:.2f} vs VeriX {vx['mean_size']:.2f} in "
                         f"{fa['mean_seconds'] / vx['mean_seconds']:.2f}x its time")
    summary = "FAME vs VeriX with the same CROWN oracle: " + "; ".join(parts) + "; every FAME explanation MILP-verified"
    return Report(gate("fame", load), [], summary, [
        ("eps = 0.05, one pixel per feature; seconds per image, one thread", ["model", "method", "images",
         "mean size", "mean s", "mean dist", "size_min", "verified"], table, rows)], rows)


def cave(load) -> Report:
    rows = load("cave")["rows"]
    table = [[str(r.get("seed")), mark(r, r["method"] + (f" ({r['explanation']})" if r.get("explanation") else "")),
              f(r["consistency_3d"], 3), f(r.get("acc_iid"), 3), f(r.get("acc_occlusion"), 3), r.get("source", "–")]
             for r in rows]
    parts, ok3d = [], True
    for seed in sorted({r.get("seed") for r in rows}):
        here = [r for r in rows if r.get("seed") == seed]
        ours = next((r for r in here if norm(r["method"]).startswith("cavenovawarelrp")
                     or (norm(r["method"]) == "cave" and r.get("explanation") == "lrp")), None)
        base = [r for r in here if not norm(r["method"]).startswith("cave")]
        if ours and base:
            b = max(base, key=lambda r: r["consistency_3d"])
            ok3d &= ours["consistency_3d"] > b["consistency_3d"]
            parts.append(f"seed {seed} {ours['consistency_3d']:.3f} vs {b['method']} {b['consistency_3d']:.3f}")
    claims = [Claim(ok3d, "3D-C of CAVE with the paper's NOV-aware LRP vs the strongest 2D baseline: "
                    + "; ".join(parts) + (": CAVE ahead" if ok3d else ": not reproduced in direction"))]
    occ = []
    for seed in sorted({r.get("seed") for r in rows}):
        here = [r for r in rows if r.get("seed") == seed and r.get("acc_occlusion") is not None]
        ca = next((r for r in here if norm(r["method"]) == "cave"), None)
        bs = [r for r in here if r is not ca]
        if ca and bs:
            occ.append((ca["acc_occlusion"], max(r["acc_occlusion"] for r in bs), seed))
    if occ:
        claims.append(Claim(all(a >= b for a, b, _ in occ), "occlusion accuracy CAVE vs 2D CNN: " + "; ".join(
            f"seed {s} {a:.3f} vs {b:.3f}" for a, b, s in occ)))
    return Report(gate("cave", load), claims, claims[0].line, [
        ("3D-C on the 120 iid-test images (higher = more consistent) and accuracies",
         ["seed", "method", "3D-C", "acc iid", "acc occlusion", "source"], table, rows)], rows)


def remove_ln(load) -> Report:
    d = load("remove-ln")
    gap = d["ce_ln_free"] - d["ce_vanilla_ft"]
    table = [["CE original", f(d["ce_original"], 4)], ["CE vanilla fine-tune (LayerNorm kept)", f(d["ce_vanilla_ft"], 4)],
             ["CE LN-free (plain export reloaded)", f(d["ce_ln_free"], 4)], ["gap LN-free − vanilla", f"{gap:+.4f}"],
             ["CE naive removal (no fine-tuning)", f(d.get("ce_naive_removal"), 4)],
             ["export max |logit diff|", f"{d['export_max_abs_logit_diff']:.1e}"],
             ["DLA max abs error", f"{d['dla_max_abs_err']:.1e}"], ["fine-tuning tokens", str(d.get("train_tokens"))]]
    summary = (f"LN-free GPT-2 {gap:+.3f} nats CE vs the LayerNorm fine-tune on the same tokens (target ≤ 0.15); "
               f"export logits within {d['export_max_abs_logit_diff']:.1e}, DLA exact to {d['dla_max_abs_err']:.1e}")
    return Report(gate("remove-ln", load), [], summary, [
        ("zoo:gpt2-small, WikiText-2 test CE (nats)", ["metric", "value"], table, [d])], [d])


# ------------------------------------------------------------------------------------------------ merge, cluster, segment

def merge_latent(load) -> Report:
    rows = load("merge-latent")["rows"]
    pairs = list(dict.fromkeys(r["pair"] for r in rows))
    table, used = [], []
    pure_parts, pure_ok, cross = [], True, []
    for pair in pairs:
        lat = method_row(rows, "latent", pair=pair)
        pure = method_row(rows, "latent pure", pair=pair)
        avg = method_row(rows, "average", pair=pair) or method_row(rows, "padded", pair=pair)
        matched = method_row(rows, "unit-matched average", pair=pair) or method_row(rows, "widened average",
                                                                                    pair=pair)
        wide = any(w in norm(pair) for w in ("width", "hetero", "size"))
        used += [r for r in (lat, pure, avg, matched) if r]
        shown = [r for r in (lat, pure, avg, matched) if r]
        label = f"{pair} †" if any(r.get("transcribed") for r in shown) else pair
        table.append([label, f(pure and pure["acc_union"], 1), f(lat and lat["acc_union"], 1),
                      f(avg and avg["acc_union"], 1) + (" (padded)" if wide else ""),
                      f(matched and matched["acc_union"], 1), "+5 over padded" if wide else "≥ average − 1"])
        if pure and avg and not wide:
            ok = pure["acc_union"] >= avg["acc_union"] - 1
            pure_ok &= ok
            if not ok:
                pure_parts.append(f"{pair} {pure['acc_union']:.1f} vs average {avg['acc_union']:.1f}")
        if lat and avg and wide:
            cross.append((lat["acc_union"] - avg["acc_union"], pair, lat["acc_union"], avg["acc_union"]))
    n_same = sum(1 for pair in pairs if not any(w in norm(pair) for w in ("width", "hetero", "size")))
    claims = [Claim(pure_ok, "the paper's pure latent merge vs weight averaging, same-size pairs, union accuracy: " + (
        f"{pure_parts[0]} (below average − 1 on {len(pure_parts)} of {n_same} pairs); our residual-corrected merge "
        "passes" if pure_parts else "≥ average − 1 on every pair"))]
    if cross:
        best = max(cross)
        claims.append(Claim(all(c[0] >= 5 for c in cross),
                            f"cross-width: best latent (ours, corrected) {best[2]:.1f} vs padded average "
                            f"{best[3]:.1f} on {best[1]} ({best[0]:+.1f}, target +5)"))
    return Report(gate("merge-latent", load), claims, claims[0].line, [
        ("Union accuracy, % (GPT-2 pairs: next-token accuracy); `latent` = residual-corrected (ours, the shipped "
         "default), `latent pure` = the paper's decoded merge", ["pair", "latent pure (paper)", "latent (ours)",
                                                                   "average", "matched average", "target"],
         table, used)], rows)


def khc(load) -> Report:
    rows = load("khc")["rows"]
    names = {norm(r["formulation"]): r["formulation"] for r in rows}
    ratios = node_ratios(rows)
    insts = sorted({r["instance"] for r in rows})
    table = []
    for key, name in names.items():
        mine = [r for r in rows if norm(r["formulation"]) == key]
        proved = sum("optimal" in norm(r["status"]) for r in mine)
        table.append([mark(mine[0], name + ("" if key in PAPER_FORMULATIONS or key == "plain" else " (ours)")),
                      f"{proved}/{len(mine)}", "1.00x" if key == "plain" else f(ratios.get(key)) + "x"])
    paper = {k: v for k, v in ratios.items() if k in PAPER_FORMULATIONS}
    claims = []
    if paper:
        k = max(paper, key=paper.get)
        ours = {names[k2]: v for k2, v in ratios.items() if k2 not in PAPER_FORMULATIONS}
        tail = "; ".join(f"{v:.1f}x with our {n} (not the paper's)" for n, v in ours.items())
        claims.append(Claim(paper[k] >= 10, f"the paper's best formulation ({names[k]}) {paper[k]:.1f}x fewer "
                                            f"branch-and-bound nodes than plain k-HC, geometric mean over "
                                            f"{len(insts)} instances (target 10x)" + (f"; {tail}" if tail else "")))
    return Report(gate("khc", load), claims, claims[0].line if claims else "no paper formulation", [
        ("SCIP from scratch on 10 planted instances; node ratio = geometric mean of plain's nodes / the "
         "formulation's (time-limited runs counted at their limit)", ["formulation", "proved optimal",
                                                                       "nodes vs plain"], table, rows)], rows)


def mbunet(load) -> Report:
    d = load("mbunet")
    rows, sp, seeds = d["rows"], d["speed"], d.get("seed_rows", [])
    table_a = [[mark(r, r["variant"]), f(r["miou"]), f(r["weights_kb"], 1), f(r.get("bitops_vs_binary")),
                f(r.get("exact_conversion")), str(r.get("seed")), str(r.get("steps"))] for r in rows]
    fp = next(r for r in rows if r["variant"] == "fp32")
    mb = next(r for r in rows if "mask" in norm(r["variant"]))
    bi = next(r for r in rows if r["variant"] == "binary")
    per = {}
    for r in seeds:
        if r.get("seed") != "mean":
            per.setdefault(r["variant"], {})[r["seed"]] = r["miou"]
    table_b = []
    for variant, by_seed in per.items():
        vals = [by_seed[s] for s in sorted(by_seed)]
        table_b.append([variant] + [f(by_seed[s]) for s in sorted(by_seed)]
                       + [pm(statistics.fmean(vals), sd_of(vals))])
    claims = []
    if "binary" in per and "masked-binary" in per:
        b, m = list(per["binary"].values()), list(per["masked-binary"].values())
        diff = statistics.fmean(m) - statistics.fmean(b)
        claims.append(Claim(diff >= 5, f"masked binary {pm(statistics.fmean(m), sd_of(m))} vs binary "
                                       f"{pm(statistics.fmean(b), sd_of(b))} mIoU over {len(m)} seeds ({diff:+.2f}, "
                                       f"target +5)"))
    else:
        claims.append(Claim(mb["miou"] >= bi["miou"] + 5, f"masked binary {mb['miou']:.2f} vs binary "
                                                          f"{bi['miou']:.2f} mIoU (seed 0 only, "
                                                          f"{mb['miou'] - bi['miou']:+.2f}, target +5)"))
    claims.append(Claim(mb["miou"] >= fp["miou"] - 5, f"masked binary {mb['miou']:.2f} vs fp32 {fp['miou']:.2f} "
                                                      f"mIoU (seed 0, target within 5)"))
    ratio_cpu = sp["cpu1_fp32_ms"] / sp["cpu1_packed_ms"]
    net_cpu = sp["cpu1_network_fp32_ms"] / sp["cpu1_network_packed_ms"]
    claims.append(Claim(ratio_cpu >= 3, f"packed binary layers {ratio_cpu:.2f}x faster than torch fp32 conv "
                                        f"(one-thread CPU time; whole network {net_cpu:.2f}x)"))
    table_c = [["wall, best of 20, " + str(sp["threads"]) + " threads", f(sp["fp32_ms"], 1), f(sp["packed_ms"], 1),
                f(sp["fp32_ms"] / sp["packed_ms"]) + "x", f(sp["network_fp32_ms"], 1), f(sp["network_packed_ms"], 1),
                f(sp["network_fp32_ms"] / sp["network_packed_ms"]) + "x"],
               ["CPU time of one thread, best of 10", f(sp["cpu1_fp32_ms"], 1), f(sp["cpu1_packed_ms"], 1),
                f(ratio_cpu) + "x", f(sp["cpu1_network_fp32_ms"], 1), f(sp["cpu1_network_packed_ms"], 1),
                f(net_cpu) + "x"]]
    tables = [("Procedural 32×32 scenes, width 16, depth 3 (mIoU on 80 validation scenes)",
               ["variant", "mIoU", "weights KB", "bit-ops vs binary", "packed = float", "seed", "steps"], table_a,
               rows)]
    if table_b:
        n = max(len(v) for v in per.values())
        tables.append(("Seeds (the seed redraws scenes and split)", ["variant"] + [f"seed {i}" for i in range(n)]
                       + ["mean ± sd"], table_b, [r for r in seeds if r.get("seed") == "mean"] or seeds))
    tables.append((f"Speed, {sp['shape']}", ["timer", "fp32 binary layers ms", "packed ms", "ratio",
                                             "whole net fp32 ms", "whole net packed ms", "ratio"], table_c, [d]))
    return Report(gate("mbunet", load), claims, claims[0].line, tables, rows + seeds + [d])


# ------------------------------------------------------------------------------------------------ RAG, uncertainty

def deeprag(load) -> Report:
    rows = load("deeprag")["rows"]
    table = [[mark(r, r["method"]), r.get("candidate", "–"), r.get("inference", "–"), f(r["em"], 3), f(r["f1"], 3),
              f(r["retrievals_per_question"])] for r in rows]
    syn = [r for r in rows if "synth" in norm(r["dataset"]) or "kb" in norm(r["dataset"])]
    dr, ar = method_row(syn, "deeprag"), method_row(syn, "always")
    claims = []
    if dr and ar:
        ok = dr["em"] >= ar["em"] and dr["retrievals_per_question"] <= 0.7 * ar["retrievals_per_question"]
        claims.append(Claim(ok, f"DeepRAG (the paper's, chosen on dev) EM {dr['em']:.3f} at "
                                f"{dr['retrievals_per_question']:.2f} retrievals vs always-retrieve {ar['em']:.3f} at "
                                f"{ar['retrievals_per_question']:.2f} ({dr['questions']} test questions, one seed): "
                                + ("fewer retrievals at no lower accuracy" if ok else
                                   "fewer retrievals, lower accuracy: not reproduced")))
    return Report(gate("deeprag", load), claims, claims[0].line if claims else "no DeepRAG row", [
        ("Synthetic KB, test split; candidates not chosen on dev are reported for the record",
         ["method", "candidate", "inference", "EM", "F1", "retrievals / question"], table, rows)],
        [r for r in (dr, ar) if r])


def mhlp(load) -> Report:
    d = load("mhlp")
    rows = d["rows"]
    means = [r for r in rows if r.get("n_seeds")]
    table = [[r["method"], str(r["n_seeds"]), pm(r["accuracy"], r.get("accuracy_sd"), 3),
              pm(r["ece"], r.get("ece_sd"), 3), pm(r["brier"], r.get("brier_sd"), 3)] for r in means]
    m, s = method_row(means, "mhlp"), method_row(means, "single")
    claims = []
    if m and s:
        diffs = []
        for seed in m["seeds"]:
            a = method_row(rows, f"mhlp seed {seed}")
            b = method_row(rows, f"single seed {seed}")
            if a and b:
                diffs.append(a["ece"] - b["ece"])
        mean_d, sd_d = statistics.fmean(diffs), sd_of(diffs)
        beyond = sd_d is not None and mean_d + sd_d < 0
        v = "beyond the seed sd" if beyond else ("direction holds, not beyond the seed sd" if mean_d < 0
                                                 else "single prompt ahead")
        claims.append(Claim(beyond, f"ECE MHLP {pm(m['ece'], m['ece_sd'], 3)} vs best single prompt "
                                    f"{pm(s['ece'], s['ece_sd'], 3)} ({m['n_seeds']} seeds, SmolLM2 SST-2; per-seed "
                                    f"difference {pm(mean_d, sd_d, 3)}): {v}; accuracy {m['accuracy']:.3f} vs "
                                    f"{s['accuracy']:.3f}"))
    return Report(gate("mhlp", load), claims, claims[0].line if claims else "no seed rows", [
        (f"SmolLM2-135M SST-2, mean ± sd over seeds; exact-posterior check: TV {d['tv_to_target']:.4f} "
         f"({d.get('tv_chains')} chains × {d.get('tv_steps_per_chain')} steps, target < 0.05)",
         ["method", "seeds", "accuracy", "ECE", "Brier"], table, means + [d])], means + [d])


def tokur(load) -> Report:
    d = load("tokur")
    rows = d["rows"]
    table_a = [[k, f(v, 3)] for k, v in d.get("auroc_by_score", {}).items()]
    table_b = [[mark(r, r["method"]), f(r["accuracy"], 3)] for r in rows]
    t = method_row(rows, "tokur")
    fair = [r for r in rows if not norm(r["method"]).startswith("tokur") and norm(r["method"]) != "oracle"]
    best = max(fair, key=lambda r: r["accuracy"]) if fair else None
    claims = []
    if t and best:
        claims.append(Claim(t["accuracy"] >= best["accuracy"],
                            f"toy best-of-4: TokUR {t['accuracy']:.3f} vs {best['method']} vote {best['accuracy']:.3f}"
                            f" (strongest baseline; random {method_row(rows, 'random')['accuracy']:.3f}), AUROC "
                            f"{d['auroc']:.3f}"))
    tables = [(f"Toy addition task: AUROC of uncertainty → error ({d.get('n_questions')} questions × 4 answers, "
               f"σ {d.get('sigma')})", ["score", "AUROC"], table_a, [d]),
              ("Toy task, best-of-4 selection accuracy", ["selection", "accuracy"], table_b, rows)]
    try:
        g = load("tokur", "results-gsm8k.json")
    except FileNotFoundError:
        g = None
    if g and isinstance(g.get("lenient"), dict):
        table_c, used = [], []
        for judge in ("lenient", "strict"):
            run = g.get(judge)
            if not isinstance(run, dict):
                continue
            sel = {r["method"]: r["accuracy"] for r in run.get("rows", []) if isinstance(r, dict)}
            table_c.append([judge, f"{run.get('n_correct')}/{run.get('n_responses')}",
                            f(run.get("auroc_by_score", {}).get("total"), 3),
                            f(run.get("auroc_by_score", {}).get("epistemic"), 3),
                            f(sel.get("tokur-epistemic"), 4), f(sel.get("random"), 4), f(sel.get("majority"), 4)])
            used.append(g)
        run = g["lenient"]
        sel = {r["method"]: r["accuracy"] for r in run.get("rows", []) if isinstance(r, dict)}
        if "tokur-epistemic" in sel and "random" in sel:
            claims.append(Claim(sel["tokur-epistemic"] >= sel["random"],
                                f"GSM8K on SmolLM2-135M ({run.get('n_questions')} questions × 4): best-of-4 by "
                                f"uncertainty {sel['tokur-epistemic']:.4f} vs random {sel['random']:.4f}, AUROC "
                                f"epistemic {run.get('auroc_by_score', {}).get('epistemic')}"))
        tables.append(("GSM8K, zoo:smollm2-135m (results-gsm8k.json)", ["judge", "right", "AUROC total",
                                                                        "AUROC epistemic", "best-of-4 TokUR",
                                                                        "random", "majority"], table_c, used[:1]))
    return Report(gate("tokur", load), claims, claims[0].line if claims else "no TokUR row", tables, rows + [d])


# ------------------------------------------------------------------------------------------------ benchmarks, studies

def bench(load) -> Report:
    rows = load("bench")["rows"]
    table = [[r["harness"], r["run"], r["model"], r["metric"], f(r["expected"], 4), f(r["measured"], 4),
              f(r["match"])] for r in rows]
    n_ok = sum(bool(r["match"]) for r in rows)
    line = (f"{n_ok} of {len(rows)} harness checks match their worked-out values (synthetic fixtures, scripted and "
            f"SmolLM2 models; no figure comparable with the papers)")
    return Report(None, [Claim(n_ok == len(rows), line)], line, [
        ("VideoMathQA and MMSearch-Plus harnesses on synthetic fixtures", ["harness", "run", "model", "metric",
                                                                          "expected", "measured", "match"],
         table, rows)], rows)


def cot(load) -> Report:
    d = load("cot")
    table = [["CoT", f(d["id_acc_cot"], 3), f(d["ood_acc_cot"], 3), f(d["id_atomic_cot"], 3),
              f(d["ood_atomic_cot"], 3), f(d["train_inferred_cot"], 3), str(d["bridge_layer_cot"])],
             ["no CoT", f(d["id_acc_nocot"], 3), f(d["ood_acc_nocot"], 3), f(d["id_atomic_nocot"], 3),
              f(d["ood_atomic_nocot"], 3), f(d["train_inferred_nocot"], 3), str(d["bridge_layer_nocot"])]]
    summary = (f"OOD two-hop accuracy {d['ood_acc_cot']:.2f} with CoT vs {d['ood_acc_nocot']:.2f} without; bridge "
               f"entity at layer {d['bridge_layer_cot']} vs {d['bridge_layer_nocot']} (never)")
    return Report(gate("cot", load), [], summary, [
        ("GPT-2 4×4×128 on a synthetic KB (accuracies; bridge layer at the r2 position)",
         ["model", "ID two-hop", "OOD two-hop", "ID atomic", "OOD atomic", "train two-hop", "bridge layer"], table,
         [d])], [d])


def benign_overfit(load) -> Report:
    d = load("benign-overfit")
    table = [[str(r["d"]), f(r["mu_norm"], 0), f(r["train_error"], 3), f(r["test_error"], 3), f(r["reference"], 3),
              f(r["abs_err"], 3), f(r["cos_half_final"], 5)] for r in d["grid"]]
    var = "; ".join(f"{k} max |diff| {v['max_abs_err_vs_reference']:.3f}" for k, v in d.get("variants", {}).items())
    summary = (f"zero training error at all {d['points']} grid points, test error within "
               f"{d['max_abs_err_vs_reference']:.3f} of the theory curve (target 0.05); {var}")
    return Report(gate("benign-overfit", load), [], summary, [
        ("Leaky-ReLU net, exponential loss, Gaussian noise, n = 50", ["d", "‖μ‖", "train err", "test err",
                                                                      "reference", "abs diff", "cos(W_T/2, W_T)"],
         table, [d])], [d])


def influence(load) -> Report:
    d = load("influence")
    ex = d["examples"]
    table = [[e["name"], e["variable"], f(e["expected"], 3), f(e["exact"], 3), f(e["mcts"], 3),
              f(e.get("mcts_mean_backup"), 3), f(e.get("expected_ace"), 3), f(e.get("ace"), 3)] for e in ex]
    worst = max(abs(e["mcts"] - e["exact"]) for e in ex)
    summary = (f"the paper's {len(ex)} worked examples reproduced exactly; UCT (max backup) within {worst:.3f} of "
               "exact (target 0.02)")
    return Report(gate("influence", load), [], summary, [
        ("Influence power of the actionable variable", ["example", "variable", "paper", "exact", "UCT (max backup)",
                                                        "UCT (mean)", "paper ACE", "ACE"], table, ex)], ex + [d])


TECHNIQUES = [
    Technique("obr", "compress my model and serve it",
              "iclrkit compress obr|rtn|gptq|sparsegpt|sparsegpt-gptq|wanda|magnitude", obr,
              "OBR: joint W4A4KV4 quantization + sparsity, QuaRot rotation, packed INT4, compressed-tensors and GGUF "
              "export"),
    Technique("int4", "compress my model and serve it", "iclrkit compress bench", int4,
              "packed INT4 and 2:4 GEMM kernels (CPU; CUDA compile-checked) for OBR-packed models"),
    Technique("eamet", "edit facts", "iclrkit edit eamet|memit", eamet,
              "EAMET mass knowledge editing with embedding alignment; MEMIT baseline"),
    Technique("prism", "unlearn a dataset", "iclrkit unlearn prism|npo|ga|rmu|eval|relearn", prism,
              "PRISM robust unlearning, baselines, MUSE-style metrics, relearning and jailbreak attacks"),
    Technique("steer", "steer", "iclrkit steer pcms|ums|ilcs|generate|sweep", steer,
              "personalized safety steering (paired mean shift) with UMS and ILCS baselines"),
    Technique("merge-latent", "merge", "iclrkit merge latent train|run, merge average|task-arithmetic|ties|padded|zoo",
              merge_latent, "LS-Merge weight VAE (layer-aware chunks, two stages, width/depth projection) and "
                            "weight-space baselines"),
    Technique("fame", "explain", "iclrkit explain fame|verix", fame,
              "formal abstract minimal explanations: own CROWN, exact MILP check"),
    Technique("cave", "explain", "iclrkit explain cave|consistency", cave,
              "CAVE concept classifier on ray-cast 3D data, 3D-C metric, NMF/Grad-CAM/LRP baselines, PASCAL3D+ and "
              "OOD-CV readers"),
    Technique("remove-ln", "explain", "iclrkit remove-ln run|analyze", remove_ln,
              "LayerNorm-free GPT-2 by fine-tuning, plain and folded export, direct logit attribution"),
    Technique("backdoor", "defend a classifier", "iclrkit defend attack|backdoor", backdoor,
              "X-GRAAD backdoor detection; STRIP and ONION baselines"),
    Technique("khc", "cluster", "iclrkit cluster khc solve|generate", khc,
              "exact 2-norm k-hyperplane clustering in SCIP"),
    Technique("mbunet", "segment", "iclrkit segment mbunet train|convert|infer|bench", mbunet,
              "masked binary U-Net, bit-packed AND+popcount kernels"),
    Technique("deeprag", "RAG", "iclrkit rag deeprag index|synth|train|run", deeprag,
              "DeepRAG: BM25/dense retrieval, retrieve-or-answer steps, tree-search synthesis, SFT + DPO, baselines"),
    Technique("tokur", "uncertainty", "iclrkit uq tokur", tokur,
              "token-level uncertainty by low-rank weight perturbation, best-of-N selection"),
    Technique("mhlp", "uncertainty", "iclrkit prompt mhlp", mhlp,
              "Metropolis-Hastings over prompts, chat-template scoring"),
    Technique("bench", "benchmarks", "iclrkit bench videomathqa|mmsearch|fixtures", bench,
              "VideoMathQA (lmms-eval scoring, frames, step judge) and MMSearch-Plus (decryption, 4-mode agent, "
              "Set-of-Mark) harnesses"),
    Technique("cot", "studies", "iclrkit study cot", cot, "chain-of-thought composition on a synthetic KB"),
    Technique("benign-overfit", "studies", "iclrkit study benign-overfit", benign_overfit,
              "benign overfitting of leaky-ReLU networks against the theory curve"),
    Technique("influence", "studies", "iclrkit causal influence", influence,
              "influence power of actionable variables, exact and MCTS"),
]
