"""The project's copy of each technique's benchmark targets, read from the committed examples/NAME/results*.json.

`gate(name, load)` applies the same targets, in the same order and with the same row matching, as the issues'
benchmark gates (the checker the maintainers run from outside the repository); it returns (ok, message) instead of
exiting. `load(name, file="results.json")` returns a parsed results file; scripts/render_results.py passes one that
reads examples/NAME/, the tests pass their own. Names without a numeric target (bench) have no gate: None.
"""

from __future__ import annotations

import math
import re
import statistics


class GateFail(Exception):
    pass


def norm(s) -> str:
    return re.sub(r"[^a-z0-9]", "", str(s).lower())


def fail(msg: str):
    raise GateFail(msg)


def pick(rows, **want):
    return [r for r in rows if all(norm(r.get(k, "")) == norm(v) for k, v in want.items())]


def method_row(rows, method, **ctx):
    """An exact (normalised) method name first, else one containing it; peer rows only when the name names the peer."""
    rows = pick(rows, **ctx)
    want = norm(method)
    exact = [r for r in rows if norm(r.get("method", "")) == want]
    if exact:
        return exact[0]
    loose = [r for r in rows if want in norm(r.get("method", ""))
             and ("llmcompressor" in want or "llmcompressor" not in norm(r.get("method", "")))]
    return loose[0] if loose else None


def gate_obr(load):
    rows = load("obr")["rows"]
    notes = []
    combos = sorted({(r.get("model"), r.get("setting")) for r in rows if norm(r.get("method")) == "obrgptq"})
    if not combos:
        fail("no OBR_GPTQ rows")
    for model, setting in combos:
        ctx = dict(model=model, setting=setting)
        obr = method_row(rows, "obrgptq", **ctx)
        sg = method_row(rows, "sparsegptgptq", **ctx)
        if not sg:
            fail(f"{model}/{setting}: no SparseGPT+GPTQ row")
        if obr["ppl"] >= sg["ppl"]:
            fail(f"{model}/{setting}: OBR {obr['ppl']:.2f} vs SparseGPT+GPTQ {sg['ppl']:.2f}")
        wa = method_row(rows, "wandartn", **ctx) or method_row(rows, "wanda", **ctx)
        if "a4" in norm(setting) and not wa:
            fail(f"{model}/{setting}: no Wanda+RTN row")
        if wa and obr["ppl"] >= wa["ppl"]:
            fail(f"{model}/{setting}: OBR {obr['ppl']:.2f} vs Wanda {wa['ppl']:.2f}")
        notes.append(f"{model}/{setting}: OBR {obr['ppl']:.2f} < SGPT+GPTQ {sg['ppl']:.2f}")
    real = [c for c in combos if "smollm" in norm(c[0])]
    if not real:
        fail("no OBR rows on the real smollm2-135m model")
    peer_done = False
    for model, setting in real:
        peer = method_row(rows, "llmcompressorsparsegptgptq", model=model, setting=setting)
        if peer:
            obr = method_row(rows, "obrgptq", model=model, setting=setting)
            if obr["ppl"] >= peer["ppl"] or obr["seconds"] >= peer["seconds"]:
                fail(f"{model}/{setting}: OBR {obr['ppl']:.2f}/{obr['seconds']:.0f}s vs llm-compressor "
                     f"{peer['ppl']:.2f}/{peer['seconds']:.0f}s")
            notes.append(f"vs llm-compressor {peer['ppl']:.2f}/{peer['seconds']:.0f}s: OBR {obr['ppl']:.2f}/"
                         f"{obr['seconds']:.0f}s")
            peer_done = True
    if not peer_done:
        fail("no llm-compressor SparseGPT+GPTQ peer row at an OBR setting on smollm2")
    return "; ".join(notes[-3:])


def gate_remove_ln(load):
    d = load("remove-ln")
    delta = d["ce_ln_free"] - d["ce_vanilla_ft"]
    if delta > 0.15:
        fail(f"CE gap {delta:.3f} > 0.15")
    if d["export_max_abs_logit_diff"] > 1e-4:
        fail(f"export diff {d['export_max_abs_logit_diff']}")
    if d["dla_max_abs_err"] > 1e-4:
        fail(f"DLA err {d['dla_max_abs_err']}")
    return f"CE gap {delta:.3f} nats; export diff {d['export_max_abs_logit_diff']:.1e}"


def gate_merge_latent(load):
    rows = load("merge-latent")["rows"]
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        lat = method_row(rows, "latent", pair=pair)
        avg = method_row(rows, "average", pair=pair) or method_row(rows, "padded", pair=pair)
        if not (lat and avg):
            fail(f"{pair}: missing latent or average row")
        need = 5.0 if ("width" in norm(pair) or "hetero" in norm(pair) or "size" in norm(pair)) else -1.0
        if lat["acc_union"] < avg["acc_union"] + need:
            fail(f"{pair}: latent {lat['acc_union']:.1f} vs average {avg['acc_union']:.1f} (need +{need})")
        out.append(f"{pair}: {lat['acc_union']:.1f} vs {avg['acc_union']:.1f}")
    return "; ".join(out)


def gate_mbunet(load):
    d = load("mbunet")
    rows = d["rows"]
    mb = next((r for r in rows if "mask" in norm(r["variant"])), None)
    bi = next((r for r in rows if "binary" in norm(r["variant"]) and "mask" not in norm(r["variant"])), None)
    fp = next((r for r in rows if "fp32" in norm(r["variant"]) or "float" in norm(r["variant"])), None)
    if not (mb and bi and fp):
        fail("missing masked/binary/fp32 rows")
    if mb["miou"] < bi["miou"] + 5 * (1 if mb["miou"] > 1 else 0.01):
        fail(f"masked {mb['miou']} vs binary {bi['miou']}")
    scale = 1 if fp["miou"] > 1 else 0.01
    if mb["miou"] < fp["miou"] - 5 * scale:
        fail(f"masked {mb['miou']} vs fp32 {fp['miou']}")
    if fp["weights_kb"] < 10 * mb["weights_kb"]:
        fail("weights not 10x smaller")
    sp = d["speed"]["fp32_ms"] / d["speed"]["packed_ms"]
    if sp < 3:
        fail(f"packed speed-up {sp:.2f} < 3")
    return f"mIoU masked {mb['miou']} binary {bi['miou']} fp32 {fp['miou']}; speed-up {sp:.1f}x"


def gate_eamet(load):
    rows = load("eamet")["rows"]
    out = []
    checked = 0
    for model in sorted({r["model"] for r in rows}):
        for n in sorted({r["n_edits"] for r in rows if r["model"] == model}):
            me = method_row(rows, "memit", model=model, n_edits=n)
            ea = method_row(rows, "eamet", model=model, n_edits=n)
            if not (me and ea):
                fail(f"{model}/{n}: missing MEMIT or EAMET row")
            scale = 1 if max(me["efficacy"], ea["efficacy"]) > 1 else 0.01
            if me["efficacy"] < 90 * scale:
                checked += 1
                if ea["efficacy"] < me["efficacy"] + 5 * scale:
                    fail(f"{model}/{n}: EAMET {ea['efficacy']} vs MEMIT {me['efficacy']}")
                if ea["specificity"] < me["specificity"] - 2 * scale:
                    fail(f"{model}/{n}: specificity {ea['specificity']} vs {me['specificity']}")
            out.append(f"{model}/{n}: {ea['efficacy']:.3g} vs {me['efficacy']:.3g}")
    if not any(r["n_edits"] >= 3000 for r in rows):
        fail("no 3000-edit row")
    return f"{checked} settings where MEMIT<90%; " + "; ".join(out[-3:])


def gate_prism(load):
    rows = load("prism")["rows"]
    pr, npo = method_row(rows, "prism"), method_row(rows, "npo")
    if not (pr and npo):
        fail("missing PRISM or NPO row")
    s = 1 if max(pr["verbmem_after_relearn"], npo["verbmem_after_relearn"]) > 1 else 0.01
    if pr["verbmem_after_relearn"] > npo["verbmem_after_relearn"] - 5 * s:
        fail(f"relearn VerbMem PRISM {pr['verbmem_after_relearn']} vs NPO {npo['verbmem_after_relearn']}")
    return f"relearn VerbMem PRISM {pr['verbmem_after_relearn']:.3g} vs NPO {npo['verbmem_after_relearn']:.3g}"


def gate_steer(load):
    rows = load("steer")["rows"]
    pc = [r for r in rows if norm(r["method"]) == "pcms"]
    um = [r for r in rows if norm(r["method"]) == "ums"]
    ok = [r for r in pc if r["category_prob_drop"] >= (50 if r["category_prob_drop"] > 1 else 0.5)
          and r["neutral_kl"] <= 0.05]
    if not ok:
        fail("no PCMS setting with >=50% drop at neutral KL <= 0.05")
    if max(r["split_half_cosine"] for r in pc) <= max(r["split_half_cosine"] for r in um):
        fail("PCMS not more stable than UMS")
    return f"PCMS best drop {max(r['category_prob_drop'] for r in ok):.3g} at KL<=0.05"


def gate_backdoor(load):
    d = load("backdoor")
    s = 1 if d["asr_before"] > 1 else 0.01
    if d["asr_before"] < 90 * s:
        fail(f"attack too weak: ASR {d['asr_before']}")
    if d["asr_after"] > 20 * s or d["asr_after"] > d["asr_strip"] / 2:
        fail(f"ASR after {d['asr_after']} (STRIP {d['asr_strip']})")
    if d["cacc_before"] - d["cacc_after"] > 2 * s:
        fail(f"CACC drop {d['cacc_before'] - d['cacc_after']}")
    if d["trigger_top1_rate"] < 90 * s:
        fail(f"trigger top-1 {d['trigger_top1_rate']}")
    return f"ASR {d['asr_before']:.3g} -> {d['asr_after']:.3g} (STRIP {d['asr_strip']:.3g})"


def gate_fame(load):
    rows = load("fame")["rows"]
    out = []
    for model in sorted({r["model"] for r in rows}):
        fa, vx = method_row(rows, "fame", model=model), method_row(rows, "verix", model=model)
        if not (fa and vx):
            fail(f"{model}: missing FAME or VeriX row")
        if fa["mean_size"] > vx["mean_size"] or fa["mean_seconds"] > vx["mean_seconds"]:
            fail(f"{model}: FAME {fa['mean_size']:.1f}/{fa['mean_seconds']:.2f}s vs VeriX "
                 f"{vx['mean_size']:.1f}/{vx['mean_seconds']:.2f}s")
        if "mlp" in norm(model) and fa["verified_fraction"] < 1.0:
            fail(f"{model}: verified {fa['verified_fraction']}")
        out.append(f"{model}: {fa['mean_size']:.1f} vs {vx['mean_size']:.1f}")
    return "; ".join(out)


def gate_cave(load):
    rows = load("cave")["rows"]
    ca = method_row(rows, "cave")
    if not ca:
        fail("no CAVE row")
    others = [r for r in rows if r is not ca]
    if not others:
        fail("no baseline rows")
    if any(ca["consistency_3d"] <= r["consistency_3d"] for r in others):
        fail("CAVE 3D-C not above every baseline")
    twod = [r for r in others if r.get("acc_occlusion") is not None]
    if twod and ca["acc_occlusion"] < max(r["acc_occlusion"] for r in twod):
        fail("CAVE occlusion accuracy below a baseline")
    return f"3D-C CAVE {ca['consistency_3d']:.3f} vs best baseline {max(r['consistency_3d'] for r in others):.3f}"


def node_ratios(rows) -> dict[str, float]:
    """Geometric mean over instances of plain's nodes / each formulation's nodes (time-limited runs at the limit)."""
    insts = sorted({r["instance"] for r in rows})
    forms = sorted({norm(r["formulation"]) for r in rows})
    plain = [f for f in forms if "plain" in f or f in ("base", "p2", "original")]
    out = {}
    for f in forms:
        if not plain or f in plain:
            continue
        ratios = []
        for i in insts:
            p = [r for r in rows if r["instance"] == i and norm(r["formulation"]) == plain[0]]
            s = [r for r in rows if r["instance"] == i and norm(r["formulation"]) == f]
            if p and s:
                if ("optimal" in norm(p[0]["status"]) and "optimal" in norm(s[0]["status"])
                        and abs(p[0]["objective"] - s[0]["objective"]) > 1e-4 * max(1, abs(p[0]["objective"]))):
                    fail(f"{i}: optimum differs between plain and {f}")
                ratios.append(max(p[0]["nodes"], 1) / max(s[0]["nodes"], 1))
        if ratios:
            out[f] = math.exp(statistics.mean(math.log(x) for x in ratios))
    return out


def gate_khc(load):
    rows = load("khc")["rows"]
    insts = sorted({r["instance"] for r in rows})
    if len(insts) < 10:
        fail(f"only {len(insts)} instances")
    forms = sorted({norm(r["formulation"]) for r in rows})
    if not [f for f in forms if "plain" in f or f in ("base", "p2", "original")]:
        fail(f"no plain formulation among {forms}")
    ratios = node_ratios(rows)
    best = max(ratios.values()) if ratios else None
    if best is None or best < 10:
        fail(f"best node ratio {best}")
    return f"strengthened formulation: {best:.1f}x fewer nodes (geo-mean)"


def gate_deeprag(load):
    rows = load("deeprag")["rows"]
    syn = [r for r in rows if "synth" in norm(r["dataset"]) or "kb" in norm(r["dataset"])]
    dr, ar = method_row(syn, "deeprag"), method_row(syn, "always")
    if not (dr and ar):
        fail("missing synthetic-KB DeepRAG or always-retrieve row")
    if dr["em"] < ar["em"] or dr["retrievals_per_question"] > 0.7 * ar["retrievals_per_question"]:
        fail(f"DeepRAG EM {dr['em']} / {dr['retrievals_per_question']} retr vs always {ar['em']} / "
             f"{ar['retrievals_per_question']}")
    return (f"EM {dr['em']:.3g} vs {ar['em']:.3g}; retrievals {dr['retrievals_per_question']:.2f} vs "
            f"{ar['retrievals_per_question']:.2f}")


def gate_mhlp(load):
    d = load("mhlp")
    if d["tv_to_target"] >= 0.05:
        fail(f"TV {d['tv_to_target']}")
    rows = d["rows"]
    m, s = method_row(rows, "mhlp"), method_row(rows, "single") or method_row(rows, "best")
    if not (m and s):
        fail("missing MHLP or single-prompt row")
    if m["ece"] > s["ece"]:
        fail(f"ECE MHLP {m['ece']} vs single {s['ece']}")
    return f"TV {d['tv_to_target']:.3f}; ECE {m['ece']:.3f} vs {s['ece']:.3f}"


def gate_tokur(load):
    d = load("tokur")
    if d["auroc"] < 0.6:
        fail(f"AUROC {d['auroc']}")
    rows = d["rows"]
    t, r = method_row(rows, "tokur"), method_row(rows, "random")
    if not (t and r):
        fail("missing tokur or random selection row")
    if t["accuracy"] < r["accuracy"]:
        fail(f"best-of-N {t['accuracy']} < random {r['accuracy']}")
    return f"AUROC {d['auroc']:.3f}; best-of-N {t['accuracy']:.3g} vs random {r['accuracy']:.3g}"


def gate_int4(load):
    d = load("int4")
    rows = d["rows"]
    dense = [r for r in rows if "sparse" not in norm(r["kernel"]) and r["n"] >= 4096]
    if not dense or min(r["speedup_vs_fp32"] for r in dense) < 2:
        fail("dense INT4 < 2x FP32")
    m = d["model"]
    if m["packed_mb"] > 0.2 * m["fp32_mb"]:
        fail("packed model > 0.2x FP32")
    return (f"INT4 speed-up {min(r['speedup_vs_fp32'] for r in dense):.2f}x; packed {m['packed_mb']:.0f} MB vs "
            f"{m['fp32_mb']:.0f} MB")


def gate_cot(load):
    d = load("cot")
    if d["ood_acc_cot"] < 0.5 or d["ood_acc_nocot"] > 0.1:
        fail(f"OOD CoT {d['ood_acc_cot']} non-CoT {d['ood_acc_nocot']}")
    if d["bridge_layer_cot"] >= d["bridge_layer_nocot"]:
        fail("bridge entity not resolved earlier with CoT")
    return f"OOD 2-hop: CoT {d['ood_acc_cot']:.2f}, non-CoT {d['ood_acc_nocot']:.2f}"


def gate_benign_overfit(load):
    d = load("benign-overfit")
    if d["max_train_error"] > 0 or d["max_abs_err_vs_reference"] > 0.05:
        fail(f"train err {d['max_train_error']}, ref err {d['max_abs_err_vs_reference']}")
    return f"max |sim - reference| {d['max_abs_err_vs_reference']:.3f} over {d['points']} points"


def gate_influence(load):
    ex = load("influence")["examples"]
    if len(ex) < 4:
        fail("fewer than 4 worked examples")
    expected = sorted([0.0, 0.162, 0.25, -0.15])
    if sorted(round(e["exact"], 3) for e in ex[:4]) != [round(x, 3) for x in expected]:
        fail(f"exact values {[e['exact'] for e in ex]}")
    if any(abs(e["mcts"] - e["exact"]) > 0.02 for e in ex):
        fail("MCTS off by > 0.02")
    return "4 worked examples reproduced; MCTS within 0.02"


GATES = {k[5:].replace("_", "-"): v for k, v in globals().items() if k.startswith("gate_")}


def gate(name: str, load) -> tuple[bool, str] | None:
    """(ok, message) of `name`'s targets on what `load` returns; None when the technique has no numeric target."""
    if name not in GATES:
        return None
    try:
        return True, GATES[name](load)
    except GateFail as e:
        return False, str(e)
    except (KeyError, TypeError, ValueError) as e:
        return False, f"results.json not in the asked shape: {type(e).__name__} {e}"
