"""Streaming merges (one tensor of each input at a time, shards written as they go) equal the in-memory merges."""

import json

import pytest
import torch

from toolkit.core.context import RunContext
from toolkit.core.errors import BadInputError
from toolkit.merge import common
from toolkit.merge.config import AverageConfig, TaskArithmeticConfig, TiesConfig
from toolkit.merge.models import untied_state
from toolkit.merge.weightspace import run_weightspace
from toolkit.models.lazy import INDEX, SafetensorsIndex


def _family(kind, root, dtype=torch.float32, n=3):
    """A base and n 'fine-tuned' variants (the base plus seeded noise), each saved as several shards."""
    import transformers

    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=80,
                                         bos_token_id=0, eos_token_id=0)
    else:
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=80,
                                          max_position_embeddings=32, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    base = root / "base"
    model.to(dtype).save_pretrained(base, max_shard_size="10KB")
    dirs = []
    for i in range(n):
        variant = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        generator = torch.Generator().manual_seed(i + 1)
        with torch.no_grad():
            for p in variant.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=generator).to(dtype))
        variant.save_pretrained(root / f"ft{i}", max_shard_size="10KB")
        dirs.append(str(root / f"ft{i}"))
    return str(base), dirs


def _written(path):
    index = SafetensorsIndex(path)
    return {n: index.get(n) for n in index.names()}


def _state(spec):
    """What the in-memory merge loads: the model in float32, tied weights once (load_for_merge without a tokenizer)."""
    from transformers import AutoModelForCausalLM

    return untied_state(AutoModelForCausalLM.from_pretrained(spec, dtype=torch.float32))


def _in_memory(kind, specs, base, **kw):
    states = [_state(s) for s in specs]
    if kind == "average":
        return common.merge_states(AverageConfig(), states, None)
    base_state = _state(base)
    if kind == "task-arithmetic":
        return common.merge_states(TaskArithmeticConfig(base=base, scaling=kw["scaling"]), states, base_state)
    return common.merge_states(TiesConfig(base=base, density=kw["density"], scaling=kw["scaling"]), states,
                               base_state)


RUNS = {"average": (AverageConfig, run_weightspace, {}),
        "task-arithmetic": (TaskArithmeticConfig, run_weightspace, {"scaling": 0.7}),
        "ties": (TiesConfig, run_weightspace, {"density": 0.4, "scaling": 0.9})}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", list(RUNS))
def test_streaming_merge_equals_in_memory(kind, arch, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "STREAM_CHUNK", 300)  # several row chunks per matrix
    monkeypatch.setattr(common, "STREAM_SHARD_BYTES", 20_000)  # and several output shards
    base, specs = _family(arch, tmp_path)
    config_cls, run, extra = RUNS[kind]
    fields = {"models": specs, **extra}
    if kind != "average":
        fields["base"] = base
    ctx = RunContext(out=tmp_path / "run", quiet=True)
    run(config_cls(**fields), ctx)
    assert ctx.metrics["streamed"] is True and ctx.metrics["n_models"] == 3
    out = tmp_path / "run" / "model"
    assert (out / INDEX).is_file() and len(list(out.glob("model-*.safetensors"))) > 1
    streamed = _written(out)
    expected = _in_memory(kind, specs, base, **extra)
    assert set(streamed) == set(SafetensorsIndex(specs[0]).names())
    for name, tensor in streamed.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name
    config = json.loads((out / "config.json").read_text())
    assert config["iclrkit"]["technique"] == f"merge.{kind}"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)  # loads as a model


def test_streaming_keeps_the_input_dtype_unless_told(tmp_path):
    base, specs = _family("llama", tmp_path, torch.bfloat16, n=2)
    ctx = RunContext(out=tmp_path / "bf16", quiet=True)
    run_weightspace(AverageConfig(models=specs), ctx)
    streamed = _written(tmp_path / "bf16" / "model")
    assert all(t.dtype == torch.bfloat16 for t in streamed.values())
    ctx = RunContext(out=tmp_path / "f32", quiet=True)
    run_weightspace(AverageConfig(models=specs, dtype="float32"), ctx)
    wide = _written(tmp_path / "f32" / "model")
    expected = common.merge_states(AverageConfig(), [_state(s) for s in specs], None)  # loaded as float32
    assert all(wide[n].dtype == torch.float32 and torch.equal(wide[n], expected[n]) for n in wide)
    assert all(torch.equal(streamed[n], expected[n].bfloat16()) for n in streamed)


def test_streaming_bad_inputs_write_nothing(tmp_path):
    base, specs = _family("llama", tmp_path, n=2)
    shard = sorted((tmp_path / "ft1").glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-50])
    with pytest.raises(BadInputError, match="truncated"):
        run_weightspace(AverageConfig(models=specs), RunContext(out=tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists()
    _, other = _family("gpt2", tmp_path / "g", n=1)
    with pytest.raises(BadInputError, match="incompatible families"):
        run_weightspace(AverageConfig(models=[specs[0], other[0]]), RunContext(out=tmp_path / "out", quiet=True))
    from safetensors.torch import load_file, save_file

    nan = tmp_path / "ft0"
    shard = sorted(nan.glob("model-*.safetensors"))[-1]
    tensors = load_file(str(shard))
    first = next(iter(tensors))
    tensors[first] = tensors[first].clone()
    tensors[first].view(-1)[0] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    base2, fresh = _family("llama", tmp_path / "fresh", n=1)
    with pytest.raises(BadInputError, match="NaN"):
        run_weightspace(AverageConfig(models=[str(nan), fresh[0]]), RunContext(out=tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists()
