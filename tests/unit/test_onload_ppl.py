"""`eval ppl --set onload=true`: perplexity block by block from the safetensors shards equals the resident
evaluation, with at most one block in memory; --dry-run plans it, and the training commands say they need the
whole model."""

import json

import pytest
import torch

from toolkit.models.lazy import INDEX, LazyModel


def _loaded_blocks(lazy) -> int:
    return sum(any(p.device.type != "meta" for p in layer.parameters()) for layer in lazy.layers)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_onloaded_perplexity_equals_resident(kind, tmp_path, one_thread):
    from test_onload import save_sharded
    from transformers import AutoModelForCausalLM

    from toolkit.eval.onloaded import perplexity_onloaded
    from toolkit.eval.perplexity import perplexity

    source = save_sharded(kind, tmp_path / kind)
    assert (source / INDEX).is_file()
    ids = torch.randint(0, 96, (150,), generator=torch.Generator().manual_seed(5))
    resident = perplexity(AutoModelForCausalLM.from_pretrained(source).eval(), ids, max_length=40, stride=24)
    lazy = LazyModel(source)
    seen = []
    onloaded = perplexity_onloaded(lazy, ids, max_length=40, stride=24, probe=lambda _: seen.append(
        _loaded_blocks(lazy)))
    assert onloaded["tokens"] == resident["tokens"] == 149 and onloaded["blocks"] == 3
    assert abs(onloaded["nll"] - resident["nll"]) <= 1e-6 * resident["nll"], (onloaded, resident)
    assert max(seen) == 1 and seen[0] == 0 and _loaded_blocks(lazy) == 0  # one block at a time, freed after



def test_eval_ppl_command_with_onload(cli, sharded_llama, text_file, one_thread):
    args = ["eval", "ppl", "-m", sharded_llama, "-d", text_file, "--max-length", "48", "--stride", "32",
            "--max-windows", "5", "--device", "cpu", "--json"]
    resident, onloaded = cli(args), cli([*args, "--set", "onload=true"])
    assert resident.exit_code == 0 and onloaded.exit_code == 0, onloaded.stderr
    want, got = json.loads(resident.stdout)["metrics"], json.loads(onloaded.stdout)["metrics"]
    assert got["onload"] is True and got["tokens"] == want["tokens"]
    assert abs(got["ppl"] - want["ppl"]) <= 1e-5 * want["ppl"]

    plans = {}
    for onload in ("false", "true"):
        result = cli([*args, "--set", f"onload={onload}", "--dry-run"])
        assert result.exit_code == 0, result.stderr
        plans[onload] = json.loads(result.stdout)["plan"]
    assert plans["true"]["onload"] is True and plans["true"]["memory"]["blocks"] == 3
    assert plans["true"]["memory"]["peak_mb"]["cpu"] < plans["false"]["memory"]["peak_mb"]["cpu"]
    assert "hessians" not in plans["true"]["memory"]["mb"]

    single = sharded_llama.parent / "single"
    single.mkdir()
    (single / "config.json").write_text((sharded_llama / "config.json").read_text())
    torch.save({}, single / "pytorch_model.bin")
    refused = cli(["eval", "ppl", "-m", single, "-d", text_file, "--set", "onload=true"])
    assert refused.exit_code == 2 and "safetensors" in refused.stderr


def test_training_dry_runs_say_they_need_the_whole_model(cli, tiny_gpt2_dir, tmp_path):
    forget = tmp_path / "forget.txt"
    forget.write_text("some text to forget\n" * 4)
    unlearn = cli(["unlearn", "ga", "-m", tiny_gpt2_dir, "-f", forget, "--dry-run"])
    remove_ln = cli(["remove-ln", "run", "-m", tiny_gpt2_dir, "--steps", "30", "--dry-run"])
    for result in (unlearn, remove_ln):
        assert result.exit_code == 0, result.stderr
        memory = json.loads(result.stdout)["plan"]["memory"]
        assert memory["whole_model"] is True and memory["onload"].startswith("not available")
        assert memory["parameters"] > 0 and memory["peak_mb_without_activations"] > 0
