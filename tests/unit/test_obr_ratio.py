"""scripts/obr_ratio.py: the two halves of #24's `compress obr` CUDA-vs-CPU ratio run the same command on the same
model; without zoo:smollm2-135m the model is a SmolLM2-135M-shaped Llama with random weights from a fixed seed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("obr_ratio", ROOT / "scripts" / "obr_ratio.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_model_has_smollm2_shape_and_the_same_bytes_every_time(tmp_path):
    from safetensors import safe_open

    ratio = _script()
    first = ratio.write_random_smollm2(tmp_path / "a", layers=1)
    second = ratio.write_random_smollm2(tmp_path / "b", layers=1)
    assert first["fingerprint"] == second["fingerprint"] and first["parameters"] == second["parameters"]
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"], config["num_hidden_layers"]) == (576, 1536, 9, 3,
                                                                                                   49152, 1)
    [shard] = (tmp_path / "a").glob("*.safetensors")
    with safe_open(shard, "pt") as handle:
        embed = handle.get_tensor("model.embed_tokens.weight")
        assert "lm_head.weight" not in handle.keys()  # tied, as in SmolLM2
    assert embed.shape == (49152, 576) and str(embed.dtype) == "torch.bfloat16"
    assert 0.015 < embed.float().std().item() < 0.025
    # a second call on a written directory reuses it
    assert ratio.write_random_smollm2(tmp_path / "a", layers=1) == first


def test_cuda_and_cpu_runs_are_the_same_command_and_record_the_model(tmp_path, monkeypatch):
    ratio = _script()
    monkeypatch.setattr(ratio, "zoo_available", lambda: False)
    monkeypatch.setattr(ratio, "write_random_smollm2", lambda path, layers=None, seed=0: {
        "fingerprint": "f" * 64, "seed": seed, "parameters": 1, "config": {"num_hidden_layers": layers or 30},
        "write_s": 0.0})
    commands = []

    def fake_run(command, cwd, env):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "run.json").write_text(json.dumps({"device": command[command.index("--device") + 1],
                                                  "metrics": {"ppl": 12.5, "compress_seconds": 3.0}}))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(ratio.subprocess, "run", fake_run)
    shared = ["--model-dir", str(tmp_path / "model")]
    assert ratio.main(["--device", "cuda", "--out", str(tmp_path / "gpu"), *shared]) == 0
    assert ratio.main(["--device", "cpu", "--model", "random", "--out", str(tmp_path / "cpu"), *shared]) == 0
    gpu, cpu = (json.loads((tmp_path / side / "obr.json").read_text()) for side in ("gpu", "cpu"))
    assert gpu["model_source"] == cpu["model_source"] == "random weights, SmolLM2-135M shape"
    assert "not available" in gpu["auto"] and gpu["fingerprint"] == cpu["fingerprint"] and gpu["layers"] == 30
    assert gpu["metrics"] == {"ppl": 12.5, "compress_seconds": 3.0} and gpu["rc"] == 0
    strip = lambda c: [a for a in c if a not in ("cuda", "cpu") and "/gpu/" not in a and "/cpu/" not in a]  # noqa: E731
    assert strip(commands[0]) == strip(commands[1])
    command = " ".join(commands[0])
    for flag in ("compress obr", "--w-bits 4", "--a-bits 16", "--kv-bits 16", "--sparsity 0.5", "--device cuda"):
        assert flag in command


def test_gpu_check_and_make_obr_cpu_call_the_script():
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    assert "scripts/obr_ratio.py --device cuda" in script and "zoo:smollm2-135m}" not in script
    makefile = (ROOT / "Makefile").read_text()
    assert "obr-cpu:" in makefile and "scripts/obr_ratio.py --device cpu" in makefile
