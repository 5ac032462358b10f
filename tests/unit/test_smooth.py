"""The `smooth` stage (SmoothQuant, toolkit/compress/smooth.py): the scales equal max|X|^α / max|W|^(1−α) computed
here from the modules by name, the smoothed float model computes the original's function, the fold is refused where
it cannot be exact, and on a model with activation outlier channels [smooth, gptq] quantizes with activations at
8 bits more accurately than [gptq]."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 300


def _model(model_type: str, outliers: bool = True):
    from toolkit.models.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny(model_type, VOCAB).float()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(("layernorm", "ln_1", "ln_2")):
                module.weight.copy_(0.5 + 1.5 * torch.rand(module.weight.shape, generator=generator))
                if outliers:
                    module.weight[[3, 17]] *= 30  # two outlier channels in every norm's output
                if getattr(module, "bias", None) is not None:
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
    return model


# block attribute path, (norm name, [linear names reading it]) — written out by hand, independent of the layout
READERS = {
    "llama": ("model.layers", [("input_layernorm", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                               ("post_attention_layernorm", ["mlp.gate_proj", "mlp.up_proj"])]),
    "gpt2": ("transformer.h", [("ln_1", ["attn.c_attn"]), ("ln_2", ["mlp.c_fc"])]),
}


def _reference_scales(model, model_type, windows, alpha):
    blocks_path, readers = READERS[model_type]
    blocks = model.get_submodule(blocks_path)
    act, handles = {}, []
    for i, block in enumerate(blocks):
        for norm, _ in readers:
            key = f"{blocks_path}.{i}.{norm}"

            def hook(module, args, out, key=key):
                m = out.abs().reshape(-1, out.shape[-1]).amax(0)
                act[key] = m if key not in act else torch.maximum(act[key], m)

            handles.append(block.get_submodule(norm).register_forward_hook(hook))
    with torch.no_grad():
        for window in windows:
            model(window.unsqueeze(0))
    for handle in handles:
        handle.remove()
    scales = {}
    for i, block in enumerate(blocks):
        for norm, linears in readers:
            key = f"{blocks_path}.{i}.{norm}"
            columns = []
            for name in linears:
                weight = block.get_submodule(name).weight
                # Conv1D (GPT-2) stores (in, out): the input channel is its first dimension
                columns.append(weight.abs().amax(1) if model_type == "gpt2" else weight.abs().amax(0))
            w_max = torch.stack(columns).amax(0).clamp(min=1e-5)
            scales[key] = (act[key].pow(alpha) / w_max.pow(1 - alpha)).clamp(min=1e-5)
    return scales


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_scales_match_the_formula_and_the_float_function_is_kept(model_type):
    from toolkit.compress.smooth import smooth_model
    from toolkit.models.view import view_of

    model = _model(model_type)
    windows = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(2))
    expected = _reference_scales(model, model_type, windows, alpha=0.6)
    blocks_path, readers = READERS[model_type]
    before_norm = model.get_submodule(f"{blocks_path}.0.{readers[0][0]}").weight.detach().clone()
    probe = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        reference = model(probe).logits
    scales = smooth_model(view_of(model), windows, 0.6, "cpu")
    assert scales.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(scales[key], expected[key], rtol=1e-5, atol=0)
    s = expected[f"{blocks_path}.0.{readers[0][0]}"]
    assert s.max() / s.min() > 5  # the outlier channels are scaled down far more than the rest
    torch.testing.assert_close(model.get_submodule(f"{blocks_path}.0.{readers[0][0]}").weight, before_norm / s)
    with torch.no_grad():
        smoothed = model(probe).logits
    torch.testing.assert_close(smoothed, reference, rtol=1e-4, atol=1e-4 * reference.abs().max().item())


def test_smoothing_is_refused_where_routers_read_the_norm():
    from toolkit.compress.smooth import smooth_targets
    from toolkit.core.errors import BadInputError
    from toolkit.models.tiny import build_tiny
    from toolkit.models.view import view_of

    with pytest.raises(BadInputError, match="routers and fused experts"):
        smooth_targets(view_of(build_tiny("mixtral", VOCAB)))


def _w8a8_error(out_dir, original, probe, a_bits):
    from transformers import AutoModelForCausalLM

    from toolkit.compress.quant import activation_quant
    from toolkit.models.view import view_of

    model = AutoModelForCausalLM.from_pretrained(out_dir / "model").float().eval()
    with torch.no_grad(), activation_quant(model, view_of(model).quantized_inputs(), a_bits):
        logits = model(probe).logits
    return (logits - original).pow(2).mean().item()


def test_smooth_then_gptq_beats_gptq_on_activation_outliers(cli, tiny_tokenizer, text_file, tmp_path):
    model = _model("llama")
    model.save_pretrained(tmp_path / "outliers")
    tiny_tokenizer.save_pretrained(tmp_path / "outliers")
    probe = torch.randint(3, VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        original = model(probe).logits
    errors = {}
    for name, stages in {"gptq": "[{gptq: {w_bits: 8}}]", "smooth": "[smooth, {gptq: {w_bits: 8}}]"}.items():
        recipe = tmp_path / "recipes" / f"{name}.yaml"
        recipe.parent.mkdir(exist_ok=True)
        recipe.write_text(f"stages: {stages}\n")
        out = tmp_path / name
        r = cli(["compress", "recipe", "--recipe", recipe, "--model", tmp_path / "outliers", "--data", text_file,
                 "--a-bits", "8", "--nsamples", "4", "--seqlen", "32", "--set", "export=dense", "--out", out,
                 "--json"])
        assert r.exit_code == 0, r.stderr
        if name == "smooth":
            assert json.loads(r.stdout)["metrics"]["smooth"]["norms"] == 4  # 2 blocks × (attention, MLP) norms
        errors[name] = _w8a8_error(out, original, probe, 8)
    assert errors["smooth"] < 0.5 * errors["gptq"], errors


@pytest.mark.parametrize("model_type", ["gemma", "phi", "opt"])  # Gemma's (1 + γ); a parallel block; OPT's biases
def test_the_float_function_is_kept_across_norm_conventions(model_type):
    from toolkit.compress.smooth import smooth_model
    from toolkit.models.tiny import build_tiny
    from toolkit.models.view import view_of

    torch.manual_seed(0)
    model = build_tiny(model_type, VOCAB).float()
    with torch.no_grad():
        for module in model.modules():
            if "norm" in type(module).__name__.lower() and getattr(module, "weight", None) is not None:
                module.weight.add_(torch.rand(module.weight.shape) * 3)
    windows = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = model(windows).logits
    scales = smooth_model(view_of(model), windows, 0.5, "cpu")
    assert scales and any((s - 1).abs().max() > 0.1 for s in scales.values())  # the weights did change
    with torch.no_grad():
        torch.testing.assert_close(model(windows).logits, reference, rtol=1e-4,
                                   atol=1e-4 * reference.abs().max().item())


def test_smoothing_is_refused_where_a_group_reads_the_residual_without_a_norm():
    from toolkit.compress.smooth import smooth_targets
    from toolkit.core.errors import BadInputError
    from toolkit.models.tiny import build_tiny
    from toolkit.models.view import view_of

    with pytest.raises(BadInputError, match="without a norm"):
        smooth_targets(view_of(build_tiny("olmo2", VOCAB)))  # post-norm blocks
