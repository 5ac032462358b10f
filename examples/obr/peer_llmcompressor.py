"""Peer rows of `make repro-obr`: llm-compressor's SparseGPT 50% → GPTQ W4 and its GPTQ W4 (per-channel, symmetric,
1% damping, block 128, lm_head and embeddings untouched) on the very calibration windows our runs use, scored with
our perplexity protocol (toolkit.eval.perplexity on the same token ids).

llm-compressor pins transformers 5.17, so it runs in its own virtual environment (.venv-bench, made by repro.sh);
the token ids come from the project's environment through a torch file.
Usage: peer_llmcompressor.py MODEL_DIR TOKENS.pt sparsegpt+gptq|gptq OUT_DIR [GROUP_SIZE|none] [ACTORDER]
(writes OUT_DIR/run.json). GROUP_SIZE: none = per channel (default), else llm-compressor's "group" strategy;
ACTORDER: static (llm-compressor's default), weight or none. Threads: whatever OMP_NUM_THREADS allows (at most 2).
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from toolkit.core.timing import Stopwatch  # noqa: E402
from toolkit.eval.perplexity import perplexity  # noqa: E402

PER_CHANNEL_W4 = {"group_0": {"targets": ["Linear"],
                              "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "channel"}}}


def w4_scheme(group_size: int | None) -> dict:
    if group_size is None:
        return PER_CHANNEL_W4
    return {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                           "strategy": "group", "group_size": group_size}}}


def recipe(name: str, group_size: int | None = None, actorder: str = "static") -> list:
    from llmcompressor.modifiers.pruning import SparseGPTModifier
    from llmcompressor.modifiers.quantization import GPTQModifier

    gptq = GPTQModifier(config_groups=w4_scheme(group_size), ignore=["lm_head"], dampening_frac=0.01,
                        block_size=128, actorder=None if actorder == "none" else actorder)
    if name == "gptq":
        return [gptq]
    return [SparseGPTModifier(sparsity=0.5, mask_structure="0:0", targets=["Linear"], ignore=["re:.*lm_head"],
                              dampening_frac=0.01, block_size=128), gptq]


def float_checkpoint(model_dir: Path, scratch: Path) -> str:
    """The zoo's SmolLM2 config records its GGUF origin as a quantization_config although the weights are float32,
    which oneshot refuses: link the files into `scratch` with that entry dropped."""
    config = json.loads((model_dir / "config.json").read_text())
    if "quantization_config" not in config:
        return str(model_dir)
    scratch.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "config.json" and not (scratch / item.name).exists():
            (scratch / item.name).symlink_to(item.resolve())
    config.pop("quantization_config")
    (scratch / "config.json").write_text(json.dumps(config, indent=2))
    return str(scratch)


def linear_sparsity(model) -> float:
    zeros = total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            zeros += int((module.weight == 0).sum())
            total += module.weight.numel()
    return zeros / max(total, 1)


def main(model_dir: str, tokens_path: str, name: str, out: Path, group_size: int | None = None,
         actorder: str = "static") -> None:
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(min(2, torch.get_num_threads()))
    out.mkdir(parents=True, exist_ok=True)
    tokens = torch.load(tokens_path)
    windows = tokens["calibration"]
    model_dir = float_checkpoint(Path(model_dir), out / "checkpoint")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    data = Dataset.from_dict({"input_ids": windows.tolist(), "attention_mask": torch.ones_like(windows).tolist()})
    with Stopwatch() as watch:
        # the tokenizer is only required by oneshot's argument checks: the windows are already token ids
        oneshot(model=model, processor=AutoTokenizer.from_pretrained(model_dir), dataset=data,
                recipe=recipe(name, group_size, actorder),
                num_calibration_samples=windows.shape[0],
                max_seq_length=windows.shape[1], shuffle_calibration_samples=False)
    result = perplexity(model, tokens["eval_ids"], max_length=tokens["max_length"], max_windows=tokens["windows"])
    import llmcompressor

    (out / "run.json").write_text(json.dumps({"technique": f"llmcompressor-{name}", "metrics": {
        "ppl": result["ppl"], "compress_seconds": round(watch.seconds, 3),
        "compress_cpu_seconds": round(watch.cpu_seconds, 3), "sparsity": round(linear_sparsity(model), 4),
        "llmcompressor_version": llmcompressor.__version__, "group_size": group_size, "actorder": actorder,
        "threads": torch.get_num_threads()}}, indent=2))


if __name__ == "__main__":
    group = sys.argv[5] if len(sys.argv) > 5 else "none"
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), None if group == "none" else int(group),
         sys.argv[6] if len(sys.argv) > 6 else "static")
