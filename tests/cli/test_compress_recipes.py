"""`iclrkit compress recipe`: composed stages equal the methods they replace, tensor for tensor, on tiny Llama
(RMSNorm, rotated) and GPT-2 (LayerNorm, Conv1D); the resolved recipe in --dry-run and run.json; bad recipes are one
line, exit 2, nothing written. The smoothing math: tests/unit/test_smooth.py."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = ["--nsamples", "4", "--seqlen", "32", "--set", "export=dense"]


def _tensors(out):
    from safetensors.torch import load_file

    files = sorted((out / "model").glob("*.safetensors"))
    assert files, f"no model written under {out}"
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def _run(cli, args, out):
    r = cli([*args, *SMALL, "--out", out, "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout), _tensors(out)


def _recipe(tmp_path, name, text):
    path = tmp_path / "recipes" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# (recipe, the method command it equals, extra run flags for both, the architectures)
EQUIVALENT = [
    ("stages: [sparsegpt, gptq]", ["sparsegpt-gptq", "--no-rotate"], []),
    ("stages: [{sparsegpt: {sparsity: 0.5}}, {gptq: {w_bits: 3, group_size: 16, actorder: group}}]",
     ["sparsegpt-gptq", "--no-rotate", "--w-bits", "3", "--group-size", "16", "--actorder", "group"], []),
    ("stages: [gptq]", ["gptq", "--no-rotate"], []),
    ("stages: [rotate, gptq]", ["gptq", "--rotate"], []),
    ("stages: [rotate, obr]", ["obr"], ["--a-bits", "4", "--kv-bits", "4"]),
    ("stages: [wanda, rtn]", ["wanda", "--no-rotate"], []),
]


@pytest.mark.parametrize("recipe,method,extra", EQUIVALENT, ids=[e[0][8:].strip("[]") for e in EQUIVALENT])
def test_recipe_equals_the_method_on_llama(cli, tiny_llama_dir, text_file, tmp_path, recipe, method, extra):
    path = _recipe(tmp_path, "r", recipe)
    common = ["--model", tiny_llama_dir, "--data", text_file, *extra]
    record, staged = _run(cli, ["compress", "recipe", "--recipe", path, *common], tmp_path / "recipe")
    _, plain = _run(cli, ["compress", method[0], *method[1:], *common], tmp_path / "method")
    _assert_identical(staged, plain)
    assert record["metrics"]["rotated"] is ("rotate" in recipe)
    quantized = [n for n in staged if n.endswith("q_proj.weight")]
    assert quantized and not torch.equal(staged[quantized[0]],  # the stages did compress (not two no-ops)
                                         _tensors_of_input(tiny_llama_dir)[quantized[0]])


def _tensors_of_input(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.parametrize("recipe,method", [("stages: [sparsegpt, gptq]", ["sparsegpt-gptq"]),
                                           ("stages: [{wanda: {nm: '2:4'}}, gptq]",
                                            ["gptq", "--nm", "2:4", "--set", "mask=wanda"])])
def test_recipe_equals_the_method_on_gpt2(cli, tiny_gpt2_dir, text_file, tmp_path, recipe, method):
    path = _recipe(tmp_path, "r", recipe)
    common = ["--model", tiny_gpt2_dir, "--data", text_file]
    _, staged = _run(cli, ["compress", "recipe", "--recipe", path, *common], tmp_path / "recipe")
    _, plain = _run(cli, ["compress", *method, *common], tmp_path / "method")
    _assert_identical(staged, plain)
    weight = staged["transformer.h.0.mlp.c_fc.weight"]
    assert 0.45 < (weight == 0).float().mean() < 0.55  # pruned


def test_run_json_and_dry_run_show_the_resolved_recipe(cli, tiny_llama_dir, text_file, tmp_path):
    path = _recipe(tmp_path, "r", "- sparsegpt: {sparsity: 0.25}\n- gptq: {w_bits: 3}\n")
    args = ["compress", "recipe", "--recipe", path, "--model", tiny_llama_dir, "--data", text_file]
    dry = cli([*args, "--dry-run"])
    assert dry.exit_code == 0, dry.stderr
    shown = json.loads(dry.stdout)
    assert [s["stage"] for s in shown["plan"]["stages"]] == ["sparsegpt", "gptq"]
    assert shown["plan"]["stages"][1]["role"] == "quantize" and shown["plan"]["rotate"] is False
    record, _ = _run(cli, args, tmp_path / "out")
    stages = record["config"]["stages"]
    assert stages[0] == {"sparsegpt": {"sparsity": 0.25, "nm": None, "blocksize": 128}}
    assert stages[1]["gptq"]["w_bits"] == 3 and stages[1]["gptq"]["actorder"] == "static"  # auto resolved
    assert record["config"]["w_bits"] == 3 and record["config"]["sparsity"] == 0.25  # what the export reads
    assert 0.25 <= record["metrics"]["sparsity"] < 0.45  # the pruned quarter, plus weights W3 rounds to 0
    again = cli(["compress", "recipe", "--config", tmp_path / "out" / "config.resolved.yaml",
                 "--out", tmp_path / "again", "--json"])  # the recorded config reproduces the run
    assert again.exit_code == 0, again.stderr
    _assert_identical(_tensors(tmp_path / "again"), _tensors(tmp_path / "out"))


@pytest.mark.parametrize("text,needle", [
    ("[gptq, rtn]", "two quantizers"),
    ("[gptq, wanda]", "comes before pruner"),
    ("[sparsegpt, magnitude, gptq]", "two pruners"),
    ("[wanda, obr]", "its own mask"),
    ("[gptq, rotate]", "whole-model transform"),
    ("[rotate, smooth, gptq]", "smooth after rotate"),
    ("[nosuch, gptq]", "unknown compress-stage method 'nosuch'"),
    ("[{gptq: {sparsity: 0.5}}]", "unknown option(s) sparsity"),
    ("[{gptq: {w_bits: 99}}]", "w_bits"),
    ("[rotate]", "no pruning or quantization stage"),
    ("{stage: gptq}", "must be a list of stages"),
])
def test_bad_recipes_are_one_line_exit_2_nothing_written(cli, tiny_llama_dir, tmp_path, text, needle):
    path = _recipe(tmp_path, "bad", f"stages: {text}\n" if text.startswith("[") else text)
    out = tmp_path / "out"
    r = cli(["compress", "recipe", "--recipe", path, "--model", tiny_llama_dir, "--out", out])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob("out.partial*"))


def test_a_stage_knob_at_the_top_is_refused(cli, tiny_llama_dir, tmp_path):
    path = _recipe(tmp_path, "r", "stages: [gptq]\n")
    r = cli(["compress", "recipe", "--recipe", path, "--model", tiny_llama_dir, "--set", "w_bits=3",
             "--out", tmp_path / "out"])
    assert r.exit_code == 2 and "'w_bits' is a stage knob" in r.stderr
    missing = cli(["compress", "recipe", "--recipe", tmp_path / "none.yaml", "--model", tiny_llama_dir,
                   "--out", tmp_path / "out"])
    assert missing.exit_code == 2 and "recipe file not found" in missing.stderr


def test_rotate_on_a_layernorm_model_is_refused(cli, tiny_gpt2_dir, text_file, tmp_path):
    path = _recipe(tmp_path, "r", "stages: [rotate, gptq]\n")
    r = cli(["compress", "recipe", "--recipe", path, "--model", tiny_gpt2_dir, "--data", text_file, *SMALL,
             "--out", tmp_path / "out"])
    assert r.exit_code == 2 and "rotation is not exact for gpt2" in r.stderr
    assert not (tmp_path / "out").exists()


def test_the_cards_list_a_recipes_stages(cli, tiny_llama_dir, text_file, tmp_path):
    path = _recipe(tmp_path, "r", "- sparsegpt: {sparsity: 0.25}\n- gptq: {w_bits: 3}\n")
    common = ["--model", tiny_llama_dir, "--data", text_file, "--nsamples", "4", "--seqlen", "32",
              "--set", "export=both"]
    r = cli(["compress", "recipe", "--recipe", path, *common, "--out", tmp_path / "recipe"])
    assert r.exit_code == 0, r.stderr
    for card in ("packed/README.md", "model/README.md"):
        lines = [ln for ln in (tmp_path / "recipe" / card).read_text().splitlines() if "Recipe stages" in ln]
        assert len(lines) == 1 and "sparsegpt (sparsity=0.25" in lines[0] and "→ gptq (w_bits=3" in lines[0], card
    exported = cli(["export", "compressed-tensors", tmp_path / "recipe", "--out", tmp_path / "ct"])
    assert exported.exit_code == 0, exported.stderr
    assert "Recipe stages: sparsegpt (sparsity=0.25" in (tmp_path / "ct" / "README.md").read_text()
    plain = cli(["compress", "gptq", "--no-rotate", *common, "--out", tmp_path / "plain"])
    assert plain.exit_code == 0, plain.stderr
    assert "Recipe stages" not in (tmp_path / "plain" / "packed" / "README.md").read_text()


def test_a_recipe_onloaded_equals_the_recipe_resident_and_the_method_onloaded(cli, sharded_llama, text_file,
                                                                               tmp_path):
    """onload=true runs a recipe's per-linear stages block by block from the shards: the same weights bit for bit
    as the resident recipe and as the method it equals, onloaded too."""
    path = _recipe(tmp_path, "r", "stages: [{sparsegpt: {sparsity: 0.5}}, {gptq: {w_bits: 4}}]")
    common = ["--model", sharded_llama, "--data", text_file]
    onload = ["--set", "onload=true"]
    record, staged_onloaded = _run(cli, ["compress", "recipe", "--recipe", path, *common, *onload], tmp_path / "a")
    _, staged = _run(cli, ["compress", "recipe", "--recipe", path, *common], tmp_path / "b")
    _, method_onloaded = _run(cli, ["compress", "sparsegpt-gptq", "--no-rotate", *common, *onload], tmp_path / "c")
    assert record["metrics"]["onload"] is True
    _assert_identical(staged_onloaded, staged)
    _assert_identical(staged_onloaded, method_onloaded)
    assert 0.45 < (staged["model.layers.0.mlp.up_proj.weight"] == 0).float().mean() < 0.6  # the stages ran
    card = (tmp_path / "a" / "model" / "README.md").read_text()
    assert "Recipe stages: sparsegpt (sparsity=0.5" in card
