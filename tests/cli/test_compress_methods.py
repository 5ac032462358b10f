"""Compress methods come from the registry (a method = one file in toolkit/compress/methods/): the magnitude
method added that way (every architecture: tests/cli/test_arch_matrix.py)."""

import json

import torch

from toolkit.core.registry import registry


def test_every_registered_method_is_a_command(cli):
    import toolkit.compress.config  # noqa: F401 - declares the methods package

    names = registry("compress").names()
    assert {"rtn", "gptq", "sparsegpt", "sparsegpt-gptq", "wanda", "obr", "magnitude"} <= set(names)
    result = cli(["compress", "--help"])
    for name in names:
        assert name in result.stdout


def test_magnitude_prunes_the_smallest_weights_of_each_row(cli, tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "mag"
    result = cli(["compress", "magnitude", "-m", tiny_llama_dir, "-d", "embedded", "--nsamples", "2", "--seqlen",
                  "16", "--sparsity", "0.5", "--no-rotate", "--set", "export=dense", "--out", out, "--json"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["metrics"]["method"] == "magnitude" and abs(record["metrics"]["sparsity"] - 0.5) < 0.02
    before = load_file(str(tiny_llama_dir / "model.safetensors"))
    after = load_file(str(out / "model" / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj.weight"
    w, q = before[name], after[name]
    kept = q != 0
    assert torch.equal(q[kept], w[kept])  # float weights kept exactly (w_bits 16 by default)
    for row in range(w.shape[0]):
        assert w[row][kept[row]].abs().min() >= w[row][~kept[row]].abs().max()
    assert (kept.sum(1) == w.shape[1] // 2).all()


def test_a_clamped_seqlen_and_missing_data_are_said_and_recorded(cli, tiny_llama_dir, tmp_path):
    out = tmp_path / "clamp"
    result = cli(["compress", "rtn", "-m", tiny_llama_dir, "--nsamples", "1", "--seqlen", "4096", "--no-rotate",
                  "--set", "export=none", "--out", out, "--json"])
    assert result.exit_code == 0, result.stderr
    assert "--seqlen 4096 clamped to 128" in result.stderr and "no --data given" in result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert any("clamped to 128" in w for w in warnings) and any("embedded" in w for w in warnings)
    assert json.loads(result.stdout)["metrics"]["seqlen"] == 128
