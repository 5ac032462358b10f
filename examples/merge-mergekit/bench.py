"""iclrkit's registered merges against real mergekit 0.1.5, on tiny checkpoints made here.

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0 mergekit==0.1.5   # once, its own venv
    PYTHONPATH=. .venv/bin/python examples/merge-mergekit/bench.py --mergekit-python .venv-bench/bin/python \
        --work /tmp/mk-bench --results examples/merge-mergekit/results.json

For every config below: mergekit (examples/merge-mergekit/mergekit_run.py, in its own venv) and `iclrkit merge
mergekit CONFIG --numerics float64|mergekit` on the same inputs, every output tensor compared (max |diff| in float64,
the share of values that differ, byte equality). DARE/DELLA: mergekit is made to draw each (tensor, model) drop from
iclrkit's per-(seed, tensor, model) stream (see mergekit_run.py), so the rest of the math is compared exactly.
Not part of `make test`: mergekit is not an iclrkit dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SEED = 7


def make_models(root: Path) -> dict[str, str]:
    """A 4-block Llama (width 64, untied head) and three seeded 'fine-tunes' of it, in float32 and bfloat16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "examples" / "house"))
    from pydoc_data.topics import topics

    from make_inputs import tokenizer

    tok = tokenizer("\n\n".join(topics[k] for k in sorted(topics))[:100_000])
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    paths = {}
    for dtype in (torch.float32, torch.bfloat16):
        tag = "f32" if dtype == torch.float32 else "bf16"
        for i in range(4):
            gen = torch.Generator().manual_seed(100 + i)
            state = base if i == 0 else {k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
            model.load_state_dict(state)
            name = f"{'base' if i == 0 else f'ft{i}'}-{tag}"
            out = root / name
            if not (out / "config.json").exists():
                model.to(dtype).save_pretrained(out)
                tok.save_pretrained(out)
                model.to(torch.float32)
            paths[name] = str(out)
    return paths


def configs(p: dict[str, str]) -> list[tuple[str, str, dict]]:
    """(row name, dtype tag, mergekit config) — float32 unless the name says bf16."""
    def models(tag, weights=None, density=None, extra=None):
        out = []
        for i, name in enumerate(("ft1", "ft2", "ft3")):
            params = {}
            if weights is not None:
                params["weight"] = weights[i]
            if density is not None:
                params["density"] = density[i] if isinstance(density, list) and len(density) == 3 else density
            params.update(extra or {})
            out.append({"model": p[f"{name}-{tag}"], **({"parameters": params} if params else {})})
        return out

    rows = []
    for tag, dtype in (("f32", "float32"), ("bf16", "bfloat16")):
        base = p[f"base-{tag}"]
        rows += [
            ("linear", tag, {"merge_method": "linear", "models": models(tag, [0.5, 0.3, 0.2]), "dtype": dtype}),
            ("linear normalize=false", tag, {"merge_method": "linear", "models": models(tag, [0.5, 0.3, 0.4]),
                                             "parameters": {"normalize": False}, "dtype": dtype}),
            ("task_arithmetic", tag, {"merge_method": "task_arithmetic", "base_model": base,
                                      "models": models(tag, [0.6, 0.4, 0.3]), "parameters": {"lambda": 0.8},
                                      "dtype": dtype}),
            ("ties", tag, {"merge_method": "ties", "base_model": base, "models": models(tag, [1.0, 0.5, 0.7], 0.5),
                           "dtype": dtype}),
            ("ties density gradient", tag, {"merge_method": "ties", "base_model": base,
                                            "models": models(tag, [1.0, 1.0, 1.0], [0.3, 0.9], ),
                                            "parameters": {"normalize": True}, "dtype": dtype}),
            ("dare_ties", tag, {"merge_method": "dare_ties", "base_model": base,
                                "models": models(tag, [1.0, 0.5, 0.7], 0.6), "dtype": dtype}),
            ("dare_linear", tag, {"merge_method": "dare_linear", "base_model": base,
                                  "models": models(tag, [0.4, 0.3, 0.3], 0.7), "dtype": dtype}),
            ("della", tag, {"merge_method": "della", "base_model": base,
                            "models": models(tag, [1.0, 0.6, 0.8], 0.5, {"epsilon": 0.1}), "dtype": dtype}),
            ("della_linear", tag, {"merge_method": "della_linear", "base_model": base,
                                   "models": models(tag, [0.5, 0.3, 0.2], 0.6, {"epsilon": 0.2}),
                                   "parameters": {"lambda": 1.2}, "dtype": dtype}),
            ("breadcrumbs", tag, {"merge_method": "breadcrumbs", "base_model": base,
                                  "models": models(tag, [0.5, 0.3, 0.2], 0.8, {"gamma": 0.05}), "dtype": dtype}),
            ("breadcrumbs_ties", tag, {"merge_method": "breadcrumbs_ties", "base_model": base,
                                       "models": models(tag, [1.0, 0.5, 0.7], 0.8, {"gamma": 0.05}),
                                       "dtype": dtype}),
            ("model_stock", tag, {"merge_method": "model_stock", "base_model": base, "models": models(tag),
                                  "dtype": dtype}),
            ("model_stock filter_wise", tag, {"merge_method": "model_stock", "base_model": base,
                                              "models": models(tag), "parameters": {"filter_wise": True},
                                              "dtype": dtype}),
            ("slerp", tag, {"merge_method": "slerp", "base_model": base,
                            "models": [{"model": base}, {"model": p[f"ft1-{tag}"]}], "parameters": {"t": 0.3},
                            "dtype": dtype}),
            ("slerp t gradient", tag, {"merge_method": "slerp", "base_model": base,
                                       "models": [{"model": base}, {"model": p[f"ft2-{tag}"]}],
                                       "parameters": {"t": [0.0, 0.5, 1.0]}, "dtype": dtype}),
            ("passthrough slices", tag, {"merge_method": "passthrough", "dtype": dtype, "slices": [
                {"sources": [{"model": p[f"ft1-{tag}"], "layer_range": [0, 3]}]},
                {"sources": [{"model": p[f"ft2-{tag}"], "layer_range": [1, 4],
                              "parameters": {"scale": [1.0, 0.5]}}]}]}),
        ]
    return rows


def tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for shard in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(shard)))
    return out


def compare(reference: dict, ours: dict) -> dict:
    names = sorted(set(reference) & set(ours))
    worst, differ, total, byte_equal = 0.0, 0, 0, True
    for name in names:
        a, b = reference[name], ours[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            return {"error": f"{name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"}
        byte_equal &= a.view(torch.uint8).equal(b.view(torch.uint8)) if a.is_floating_point() else a.equal(b)
        d = (a.double() - b.double()).abs()
        worst = max(worst, float(d.max())) if d.numel() else worst
        differ += int((d > 0).sum())
        total += d.numel()
    return {"tensors": len(names), "missing": sorted(set(reference) ^ set(ours)), "max_abs_diff": worst,
            "differing_fraction": differ / max(total, 1), "byte_identical": bool(byte_equal and set(reference) ==
                                                                                   set(ours))}


def run(cmd: list[str], **kw) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr[-3000:]}")


def main() -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mergekit-python", required=True, help="python of the venv that has mergekit 0.1.5")
    ap.add_argument("--work", type=Path, default=Path("/tmp/iclrkit-mergekit-bench"))
    ap.add_argument("--results", type=Path, default=HERE / "results.json")
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    paths = make_models(args.work / "models")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    mergekit_version = subprocess.run([args.mergekit_python, "-c", "import importlib.metadata as m; "
                                       "print(m.version('mergekit'))"], capture_output=True, text=True).stdout.strip()
    rows = []
    for index, (name, tag, data) in enumerate(configs(paths)):
        if args.only and name not in args.only:
            continue
        case = args.work / "runs" / f"{index:02d}"
        if case.exists():
            import shutil

            shutil.rmtree(case)
        case.mkdir(parents=True)
        config = case / "config.yml"
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        run([args.mergekit_python, str(HERE / "mergekit_run.py"), str(config), str(case / "mergekit"), str(SEED)],
            env=env)
        reference = tensors(case / "mergekit")
        for numerics in ("float64", "mergekit"):
            out = case / f"iclrkit-{numerics}"
            command = ["iclrkit", "merge", "mergekit", "config.yml", "--numerics", numerics, "--seed", str(SEED),
                       "--device", "cpu", "-o", "out"]
            run([sys.executable, "-m", "cli.main", "merge", "mergekit", str(config), *command[4:-1], str(out)],
                env=env, cwd=ROOT)
            row = {"method": data["merge_method"], "case": name, "dtype": {"f32": "float32", "bf16": "bfloat16"}[tag],
                   "numerics": numerics, **compare(reference, tensors(out / "model")),
                   "config": yaml.safe_dump({k: v for k, v in data.items()}, sort_keys=False)
                   .replace(str(args.work / "models") + "/", ""),
                   "command": f"mergekit_run.py config.yml mergekit {SEED}  vs  " + " ".join(command),
                   "bench_command": "PYTHONPATH=. .venv/bin/python examples/merge-mergekit/bench.py "
                                    "--mergekit-python .venv-bench/bin/python", "commit": commit,
                   "mergekit": mergekit_version}
            rows.append(row)
            print(f"{name:26s} {row['dtype']:9s} {numerics:8s} max|diff| {row.get('max_abs_diff', row.get('error'))}"
                  f"  differing {row.get('differing_fraction', 0):.3%}  byte-identical {row.get('byte_identical')}",
                  flush=True)
    args.results.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
