"""Per-block onloading: the lazy safetensors source and the onloaded pipeline equal the resident path bit for bit."""

import json

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.models.lazy import INDEX, LazyModel, SafetensorsIndex
from toolkit.nn.pipeline import run_sequential, run_sequential_onloaded


def _tiny(kind: str):
    import transformers

    common = dict(vocab_size=96, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=3, n_head=4, n_positions=64, vocab_size=96,
                                         bos_token_id=0, eos_token_id=0)
    elif kind == "llama":
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, **common)
    else:
        config = transformers.Qwen2Config(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                          **common)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def save_sharded(kind: str, path, dtype=torch.float32):
    model = _tiny(kind).to(dtype)
    model.save_pretrained(path, max_shard_size="12KB")
    return path


def gptq_on_block(record=None):
    """A calibrate → apply step as the compress recipe runs it: per sequential group one Hessian, GPTQ 4-bit."""
    from toolkit.compress.quant import fit_weight_scale
    from toolkit.compress.solvers import damp_hessian, gptq

    def on_block(step):
        for group in step.layout.groups:
            tap, = step.group_hessians([group])
            acc = tap.accumulators()[group.names[0]]
            acc.all_reduce()
            if record is not None:
                record[f"{step.index}.{group.names[0]}"] = acc.H.clone()
            for slot in group.slots:
                W = slot.weight(step.block).double()
                scale = fit_weight_scale(W, 4, mse=False)
                slot.set_weight(step.block, gptq(W, damp_hessian(acc.H), scale, 4).float())
    return on_block


def _windows(n=4, seqlen=16):
    return torch.randint(0, 96, (n, seqlen), generator=torch.Generator().manual_seed(1))


def _read_dir(path) -> dict[str, torch.Tensor]:
    index = SafetensorsIndex(path)
    return {name: index.get(name) for name in index.names()}


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_onloaded_pipeline_equals_resident_bit_for_bit(kind, tmp_path):
    from transformers import AutoModelForCausalLM

    source = save_sharded(kind, tmp_path / "src")
    shards = json.loads((source / INDEX).read_text())["weight_map"]
    assert len(set(shards.values())) >= 3
    windows = _windows()

    resident = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    run_sequential(resident, windows, gptq_on_block())
    expected = resident.state_dict()

    lazy = LazyModel(source)
    assert all(p.device.type == "meta" for p in lazy.layers.parameters())
    summary = run_sequential_onloaded(lazy, windows, gptq_on_block(), out_dir=tmp_path / "out",
                                      max_shard_bytes=30_000)
    assert summary["blocks"] == 3 and len(summary["seconds_per_block"]) == 3
    assert all(p.device.type == "meta" for p in lazy.layers.parameters())  # every block freed again
    written = _read_dir(tmp_path / "out")
    assert (tmp_path / "out" / INDEX).is_file()
    assert set(written) == set(shards)  # the checkpoint's names (a tied head is not written twice)
    for name, tensor in written.items():
        assert torch.equal(tensor, expected[name]), name
    # the weights really changed (GPTQ ran): the first block's q/c_attn differs from the source
    original = _read_dir(source)
    changed = [n for n in written if ".0." in n and n.endswith("weight") and written[n].dim() == 2
               and not torch.equal(written[n], original[n])]
    assert changed


def test_lazy_model_loads_like_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM

    source = save_sharded("llama", tmp_path / "src", torch.bfloat16)
    lazy = LazyModel(source, dtype=torch.float32)
    assert lazy.index.dtype == torch.bfloat16
    lazy.load_non_block()
    for i in range(len(lazy.layers)):
        lazy.load_block(i)
    reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ids = _windows(2, 12)
    with torch.no_grad():
        assert torch.equal(lazy.model(ids).logits, reference(ids).logits)
    lazy.free_block(1)
    assert all(p.device.type == "meta" for p in lazy.layers[1].parameters())


def _expect_bad(path, match):
    with pytest.raises(BadInputError, match=match):
        LazyModel(path)


def test_missing_shard_is_bad_input(tmp_path):
    source = save_sharded("llama", tmp_path / "src")
    shard = sorted(source.glob("model-*.safetensors"))[1]
    shard.unlink()
    _expect_bad(source, "missing")


def test_truncated_shard_is_bad_input(tmp_path):
    source = save_sharded("gpt2", tmp_path / "src")
    shard = sorted(source.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    _expect_bad(source, "truncated")


def test_dtype_mismatch_between_shards_is_bad_input(tmp_path):
    from safetensors.torch import load_file, save_file

    source = save_sharded("qwen2", tmp_path / "src")
    shard = sorted(source.glob("model-*.safetensors"))[-1]
    save_file({k: v.half() for k, v in load_file(str(shard)).items()}, str(shard))
    _expect_bad(source, "disagree on the weight dtype")


def test_bad_shards_exit_2_and_write_nothing(tmp_path):
    """Through the CLI-facing error path: one line, exit code 2, no output directory."""
    import subprocess
    import sys

    source = save_sharded("llama", tmp_path / "src")
    sorted(source.glob("model-*.safetensors"))[0].unlink()
    out = tmp_path / "out"
    code = ("import sys\nfrom toolkit.core.errors import IclrkitError\nfrom toolkit.models.lazy import LazyModel\n"
            "from toolkit.nn.pipeline import run_sequential_onloaded\nimport torch\n"
            "try:\n    lazy = LazyModel(sys.argv[1])\n"
            "    run_sequential_onloaded(lazy, torch.zeros(1, 4, dtype=torch.long), lambda s: None, out_dir=sys.argv[2])\n"
            "except IclrkitError as exc:\n    print(exc, file=sys.stderr)\n    sys.exit(exc.exit_code)\n")
    result = subprocess.run([sys.executable, "-c", code, str(source), str(out)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "missing" in result.stderr
    assert not out.exists()


def test_shard_writer_streams_in_the_planned_layout(tmp_path):
    from safetensors.torch import load_file

    from toolkit.core.errors import RunError
    from toolkit.models.shards import ShardWriter

    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.randn(4).bfloat16(), "d": torch.tensor(True)}
    layout = [(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    writer = ShardWriter(tmp_path / "out", layout, max_shard_bytes=64)
    for name, value in tensors.items():
        writer.add({name: value})
    index = writer.close()
    assert len(set(index["weight_map"].values())) == 3  # 60 | 56+8 | 1 bytes
    read = {}
    for shard in sorted((tmp_path / "out").glob("model-*.safetensors")):
        read.update(load_file(str(shard)))
    assert set(read) == set(tensors) and all(torch.equal(read[k], tensors[k]) for k in tensors)
    bad = ShardWriter(tmp_path / "bad", layout)
    with pytest.raises(RunError, match="expected 'a'"):
        bad.add({"b": tensors["b"]})
    bad.add({"a": tensors["a"]})
    bad.abort()
    assert not any((tmp_path / "bad").iterdir())
