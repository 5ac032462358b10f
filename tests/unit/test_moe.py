"""Mixture-of-experts models (transformers 5 fused experts): each expert calibrated on exactly the tokens its router
sends it (or every token), starved experts warned about and given their fallback, every compression method applied
per expert, per-expert checkpoints read and written by the onloaded pipeline, the memory plan counting experts, and
bad input (top-k beyond the experts, a fused tensor of another layout) refused."""

import json

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.models.tiny import build_tiny
from toolkit.models.view import view_of

pytestmark = pytest.mark.usefixtures("one_thread")


def _model(model_type="mixtral"):
    torch.manual_seed(0)
    return build_tiny(model_type, 97)


def _routed_reference(model, ids, block_index):
    """Independently of the toolkit: the experts' input and routing at block `block_index` from hooks on the
    experts module's own call, and each expert's Hessian 2/n Σ x xᵀ over its routed tokens."""
    seen = {}
    experts = model.model.layers[block_index].mlp.experts

    def hook(module, args):
        seen["hidden"], seen["index"] = args[0].detach().double(), args[1]
    handle = experts.register_forward_pre_hook(hook)
    with torch.no_grad():
        model(ids)
    handle.remove()
    reference = {}
    for e in range(experts.gate_up_proj.shape[0]):
        rows = (seen["index"] == e).any(-1)
        x = seen["hidden"][rows]
        reference[e] = (2.0 / max(len(x), 1)) * x.t() @ x, int(rows.sum())
    return reference, seen


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_each_expert_hessian_comes_from_its_routed_tokens(model_type):
    from toolkit.nn.pipeline import run_sequential

    model = _model(model_type)
    ids = torch.randint(3, 97, (1, 24), generator=torch.Generator().manual_seed(1))
    reference, _ = _routed_reference(model, ids, 0)
    got = {}

    def on_block(step):
        if step.index == 0:
            group = next(g for g in step.layout.groups if g.role == "experts_in")
            tap, = step.group_hessians([group], torch.float64)
            got.update({s.expert: (tap.accumulators()[s.name].H, tap.tokens[s.name]) for s in group.slots})
    run_sequential(model, ids, on_block)
    assert sum(count for _, count in got.values()) == 24 * model.config.num_experts_per_tok
    for expert, (H, count) in got.items():
        assert count == reference[expert][1]
        torch.testing.assert_close(H, reference[expert][0], rtol=1e-6, atol=1e-9)


def test_down_projection_inputs_are_act_gate_times_up_of_the_routed_tokens():
    """The down projection's per-expert input is act(gate)·up of the expert's tokens, with its current weights."""
    from toolkit.models.experts import down_input, expert_forward, routed_tokens

    experts = _model().model.layers[0].mlp.experts
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(10, 64, generator=generator)
    index = torch.stack([torch.randperm(4, generator=generator)[:2] for _ in range(10)])
    weights = torch.rand(10, 2, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(expert_forward(experts, hidden, index, weights), experts(hidden, index, weights))
        tokens = routed_tokens(index, 4)[1]
        gate, up = (hidden[tokens] @ experts.gate_up_proj[1].t()).chunk(2, dim=-1)
        torch.testing.assert_close(down_input(experts, 1, hidden[tokens]), experts.act_fn(gate) * up)


def _compress(cli, source, out, method, *extra):
    return cli(["compress", method, "-m", source, "-d", "embedded", "--nsamples", "2", "--seqlen", "16",
                "--w-bits", "4", "--a-bits", "16", "--kv-bits", "16", "--no-rotate", "--set", "export=dense",
                "-o", out, "--json", *extra])


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("mixtral") / "model"
    torch.manual_seed(0)
    build_tiny("mixtral", len(tiny_tokenizer)).save_pretrained(path, max_shard_size="40KB")
    tiny_tokenizer.save_pretrained(path)
    return path


def _experts_of(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory).model.layers[0].mlp.experts


@pytest.mark.parametrize("method,extra,check", [
    ("rtn", [], "grid"), ("gptq", ["--set", "actorder=static"], "grid"), ("sparsegpt", ["--sparsity", "0.5"], "half"),
    ("wanda", ["--sparsity", "0.5"], "half"), ("magnitude", ["--sparsity", "0.5"], "half"),
    ("obr", ["--sparsity", "0.5"], "grid+half")])
def test_every_method_applies_per_expert(cli, mixtral_dir, tmp_path, method, extra, check):
    result = _compress(cli, mixtral_dir, tmp_path / method, method, *extra)
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    tokens = record["metrics"]["expert_tokens"]["model.layers.0.mlp.experts.gate_up_proj"]
    assert len(tokens) == 4 and sum(tokens) == 2 * 16 * 2
    before, after = _experts_of(mixtral_dir), _experts_of(tmp_path / method / "model")
    for param in ("gate_up_proj", "down_proj"):
        for e in range(4):
            w0, w = getattr(before, param)[e], getattr(after, param)[e]
            assert not torch.equal(w0, w), (param, e)
            if "half" in check:  # each row keeps half its weights (unstructured 50 % per row)
                assert abs(float((w == 0).float().mean()) - 0.5) < 0.05
            if "grid" in check:
                for row in w[:4]:
                    assert row[row != 0].abs().unique().numel() <= 8


def _starve_expert(monkeypatch, expert: int):
    """Routers that never pick `expert` (a real router can starve an expert on a small calibration set)."""
    from transformers.models.mixtral import modeling_mixtral

    original = modeling_mixtral.MixtralTopKRouter.forward

    def forward(self, hidden_states):
        logits, _, _ = original(self, hidden_states)
        logits = logits.clone()
        logits[:, expert] = float("-inf")
        probs = torch.softmax(logits.float(), dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        return logits, top / top.sum(-1, keepdim=True), index
    monkeypatch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", forward)


@pytest.mark.parametrize("fallback", ["all-tokens", "rtn"])
def test_a_starved_expert_is_warned_about_and_gets_its_fallback(cli, mixtral_dir, tmp_path, monkeypatch, fallback):
    _starve_expert(monkeypatch, 3)
    result = _compress(cli, mixtral_dir, tmp_path / "out", "gptq", "--set", f"moe_fallback={fallback}")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["metrics"]["expert_tokens"]["model.layers.0.mlp.experts.gate_up_proj"][3] == 0
    assert any("experts [3] saw fewer than 1 calibration tokens" in w for w in record["warnings"])
    assert "experts [3] saw fewer than 1" in result.stderr
    fallbacks = record["metrics"]["expert_fallback"]
    assert fallbacks["model.layers.0.mlp.experts.gate_up_proj"] == {"experts": [3], "fallback": fallback}
    assert _compress(cli, mixtral_dir, tmp_path / "rtn", "rtn").exit_code == 0
    w = _experts_of(tmp_path / "out" / "model").gate_up_proj
    rtn = _experts_of(tmp_path / "rtn" / "model").gate_up_proj
    assert torch.equal(w[3], rtn[3]) == (fallback == "rtn")  # all-token GPTQ moves off plain rounding
    assert not torch.equal(w[0], rtn[0])  # the routed experts are GPTQ's either way


def test_a_starved_expert_can_stop_the_run(cli, mixtral_dir, tmp_path, monkeypatch):
    _starve_expert(monkeypatch, 2)
    result = _compress(cli, mixtral_dir, tmp_path / "out", "gptq", "--set", "moe_fallback=refuse")
    assert result.exit_code == 2
    assert "experts [2] saw fewer than 1 calibration tokens" in result.stderr
    assert not (tmp_path / "out").exists()


def test_all_token_calibration_gives_every_expert_every_token(cli, mixtral_dir, tmp_path):
    result = _compress(cli, mixtral_dir, tmp_path / "all", "gptq", "--set", "moe_calibration=all")
    assert result.exit_code == 0, result.stderr
    tokens = json.loads(result.stdout)["metrics"]["expert_tokens"]
    assert all(counts == [32, 32, 32, 32] for counts in tokens.values())


def test_routers_stay_float_unless_asked(cli, mixtral_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    def router(directory):
        return AutoModelForCausalLM.from_pretrained(directory).model.layers[0].mlp.gate.weight

    assert _compress(cli, mixtral_dir, tmp_path / "a", "rtn").exit_code == 0
    assert torch.equal(router(tmp_path / "a" / "model"), router(mixtral_dir))
    assert _compress(cli, mixtral_dir, tmp_path / "b", "rtn", "--set", "quantize_routers=true").exit_code == 0
    quantized = router(tmp_path / "b" / "model")
    assert not torch.equal(quantized, router(mixtral_dir))
    assert all(row[row != 0].abs().unique().numel() <= 8 for row in quantized)


def test_onloaded_moe_reads_and_writes_per_expert_checkpoints(cli, mixtral_dir, tmp_path):
    from safetensors import safe_open

    assert _compress(cli, mixtral_dir, tmp_path / "res", "gptq").exit_code == 0
    result = _compress(cli, mixtral_dir, tmp_path / "on", "gptq", "--set", "onload=true")
    assert result.exit_code == 0, result.stderr
    a, b = _experts_of(tmp_path / "res" / "model"), _experts_of(tmp_path / "on" / "model")
    assert torch.equal(a.gate_up_proj, b.gate_up_proj) and torch.equal(a.down_proj, b.down_proj)
    names = set()
    for path in (tmp_path / "on" / "model").glob("*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            names |= set(handle.keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in names  # the checkpoint's own layout


def test_memory_plan_counts_each_experts_hessian(mixtral_dir):
    from toolkit.models.memory import plan_memory

    plan = plan_memory(mixtral_dir, nsamples=2, seqlen=16, hessian_dtype=torch.float32)
    # 4 experts' down-projection Hessians (64 x 64 inputs) or gate/up (64): at least E x in^2 floats
    assert plan["experts"] == 4 and plan["bytes"]["hessians"] >= 4 * 64 * 64 * 4 + 7 * 64 * 64 * 4


def test_top_k_beyond_the_experts_is_bad_input(cli, mixtral_dir, tmp_path):
    config = json.loads((mixtral_dir / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for path in mixtral_dir.iterdir():
        (bad / path.name).write_bytes(path.read_bytes())
    (bad / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 6}))
    result = _compress(cli, bad, tmp_path / "out", "rtn")
    assert result.exit_code == 2 and "num_experts_per_tok=6 of 4 experts" in result.stderr
    assert not (tmp_path / "out").exists()


def test_fused_experts_of_another_layout_are_refused():
    from toolkit.models.experts import check_experts

    experts = _model().model.layers[0].mlp.experts
    experts.down_proj = torch.nn.Parameter(torch.zeros(4, 64, 48))
    with pytest.raises(BadInputError, match="not \\[E, 2I, H\\] and \\[E, H, I\\]"):
        check_experts(experts, "mixtral")
    view = view_of(_model())
    assert view.layout(0).experts == "mlp.experts"
