"""Unlearning objectives live on the core registry ("unlearn"): the CLI makes one command per registered objective
and run_unlearn picks the objective by `config.method`. A new objective is one registration: here one registered in
the test runs end to end through that path, and its result is checked against AdamW's closed form."""

import json
import math
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from toolkit.core.errors import BadInputError
from toolkit.core.registry import registry
from toolkit.unlearn.config import TRAIN_FLAGS, UnlearnConfig

pytestmark = pytest.mark.usefixtures("one_thread")


class ShiftConfig(UnlearnConfig):
    """Test objective: minimise the sum of the final LayerNorm's bias (nothing else trains)."""

    method: Literal["bias-shift"] = "bias-shift"


def _bias_shift(config, ctx, model, corpus):
    bias = model.transformer.ln_f.bias

    def step(s):
        loss = s.params[0].sum()
        s.backward(loss)
        return {"bias_sum": loss.item()}

    return step, [bias], {"trained": "ln_f.bias"}


@pytest.fixture()
def shift_objective(monkeypatch):
    """Register the test objective on a copy of the registry's entries, so the built-ins are untouched after."""
    reg = registry("unlearn")
    reg.names()  # import the built-in objectives first
    monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    reg.register("bias-shift", config=ShiftConfig, needs_retain=False, flags=TRAIN_FLAGS,
                 help="Test: shift ln_f.bias down.")(_bias_shift)
    return reg.get("bias-shift")


def test_builtin_objectives_are_registered_and_each_is_a_command(cli):
    from toolkit.unlearn.config import GaConfig, NpoConfig, PrismConfig, RmuConfig

    reg = registry("unlearn")
    assert {"prism", "npo", "ga", "rmu"} <= set(reg.names())
    for name, config in {"prism": PrismConfig, "npo": NpoConfig, "ga": GaConfig, "rmu": RmuConfig}.items():
        entry = reg.get(name)
        assert entry.config is config and config.model_fields["method"].default == name
        assert set(TRAIN_FLAGS) <= set(entry.flags)
        result = cli(["unlearn", name, "--help"])
        assert result.exit_code == 0 and "--forget" in result.stdout and "--max-steps" in result.stdout
    assert reg.get("ga").needs_retain(GaConfig(model="m", forget="f")) is False
    assert reg.get("ga").needs_retain(GaConfig(model="m", forget="f", retain_coeff=1.0)) is True


def test_a_registered_objective_runs_through_the_registry_path(shift_objective, tiny_gpt2_dir, text_file, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from cli.unlearn import objective_command

    app = typer.Typer()
    objective_command(app, shift_objective)
    app.command("other")(lambda: None)  # a second command keeps `bias-shift` a subcommand
    forget = tmp_path / "forget.json"
    text = text_file.read_text()
    forget.write_text(json.dumps([text[i:i + 300] for i in range(0, 1200, 300)]))
    out, lr, steps = tmp_path / "shift", 0.01, 3
    result = CliRunner().invoke(app, ["bias-shift", "-m", str(tiny_gpt2_dir), "-f", str(forget), "-o", str(out),
                                      "--lr", str(lr), "--max-steps", str(steps), "--max-length", "24",
                                      "--device", "cpu"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["technique"] == "unlearn.bias-shift" and record["config"]["method"] == "bias-shift"
    metrics = record["metrics"]
    assert metrics["steps"] == steps and metrics["trained"] == "ln_f.bias" and "final_bias_sum" in metrics
    assert metrics["retain_windows"] == 0 and metrics["forget_windows"] >= 4

    before = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    # AdamW (no weight decay) on a constant gradient c·1 (the all-ones gradient clipped to norm 1): every step
    # moves each element by lr·c/(c + eps) exactly, since m̂ = c and v̂ = c² at every step
    c = 1.0 / (math.sqrt(before["transformer.ln_f.bias"].numel()) + 1e-6)
    expected = before["transformer.ln_f.bias"] - steps * lr * c / (c + 1e-8)
    torch.testing.assert_close(after["transformer.ln_f.bias"], expected, rtol=0, atol=1e-6)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == ["transformer.ln_f.bias"]


def test_the_method_must_match_its_config_class(shift_objective):
    from toolkit.unlearn.run import objective_for

    assert objective_for(ShiftConfig(model="m", forget="f")) is shift_objective
    with pytest.raises(BadInputError, match="takes a ShiftConfig"):
        objective_for(UnlearnConfig(model="m", forget="f", method="bias-shift"))
    with pytest.raises(BadInputError, match="names no unlearning objective"):
        objective_for(UnlearnConfig(model="m", forget="f"))
    with pytest.raises(BadInputError, match="unknown unlearn method 'nope'") as info:
        objective_for(UnlearnConfig(model="m", forget="f", method="nope"))
    assert "bias-shift" in info.value.one_line() and "prism" in info.value.one_line()


def test_the_command_names_the_objective_over_the_config_layers(cli, tmp_path):
    """`method` is a config key a YAML recipe may name, but `iclrkit unlearn NAME` runs NAME (flags win)."""
    result = cli(["unlearn", "npo", "-m", "x", "-f", "f.json", "--set", "method=prism", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["technique"] == "unlearn.npo" and shown["config"]["method"] == "npo"
    plan = shown["plan"]
    assert {k: plan[k] for k in ("objective", "epochs", "max_steps")} == {"objective": "npo", "epochs": 10,
                                                                          "max_steps": None}
    assert plan["memory"]["whole_model"] is True and "not available" in plan["memory"]["onload"]
