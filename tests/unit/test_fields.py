"""cli._fields: Typer options generated from a pydantic config (each knob declared once, on its field)."""

import json
from typing import Literal

import pytest
import typer
from pydantic import Field
from typer.testing import CliRunner

from cli._fields import config_command, option_for
from toolkit.core.config import BaseConfig

SEEN = {}


class ToyConfig(BaseConfig):
    name: str = Field(description="A required name.")
    steps: int = Field(10, ge=1, description="Steps.", json_schema_extra={"short": "-n"})
    rate: float = Field(0.5, description="Rate.")
    mode: Literal["fast", "exact"] = Field("fast", description="How.")
    clip: bool = Field(True, description="Clip the gradient.")
    tags: list[str] | None = Field(None, description="A tag (repeatable).", json_schema_extra={"flag": "--tag"})
    given: dict[str, str] = Field({}, description="An observation.")


def toy_run(config, ctx):
    SEEN["config"] = config
    ctx.metrics["steps"] = config.steps


def _app():
    app = typer.Typer()
    config_command(app, "toy", config=ToyConfig, run=toy_run, technique="test.toy", help="Toy command.",
                   flags=["name", "steps", "rate", "mode", "clip", "tags", "given"], needs_out=False,
                   optional_out=True)
    app.command("other")(lambda: None)  # a second command keeps `toy` a subcommand
    return app


def _invoke(*args):
    return CliRunner().invoke(_app(), ["toy", *args], catch_exceptions=False)


def test_help_lists_every_field_with_its_description():
    result = _invoke("--help")
    assert result.exit_code == 0
    for text in ("--name", "A required name.", "--steps", "-n", "--rate", "--mode", "fast | exact", "--clip",
                 "--no-clip", "--tag", "--given", "NAME=VALUE", "--out", "--set", "--json"):
        assert text in result.stdout, text


def test_flags_become_the_config_and_untyped_flags_keep_the_lower_layers(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("steps: 7\nrate: 0.25\n")
    result = _invoke("--name", "x", "--config", yaml, "-n", "3", "--no-clip", "--tag", "a", "--tag", "b",
                     "--given", "U=1", "--mode", "exact", "--json")
    assert result.exit_code == 0, result.stderr
    config = SEEN["config"]
    assert (config.steps, config.rate, config.clip, config.tags, config.given, config.mode) == \
        (3, 0.25, False, ["a", "b"], {"U": "1"}, "exact")
    assert json.loads(result.stdout)["metrics"]["steps"] == 3


def test_bad_values_are_one_line_and_exit_2():
    assert _invoke("--steps", "1").exit_code == 2  # --name is required
    result = _invoke("--name", "x", "--mode", "slow")
    assert result.exit_code == 2 and "mode" in result.stderr
    result = _invoke("--name", "x", "--given", "U")
    assert result.exit_code == 2 and "NAME=VALUE" in result.stderr
    result = _invoke("--name", "x", "--steps", "0")
    assert result.exit_code == 2 and "steps" in result.stderr


def test_a_field_without_description_cannot_become_a_flag():
    class Bare(BaseConfig):
        x: int = 1

    with pytest.raises(TypeError, match="needs a description"):
        option_for(Bare, "x")


class CommaConfig(BaseConfig):
    sizes: list[int] = Field([1], description="Sizes.", json_schema_extra={"flag": "--n", "style": "comma"})


def comma_run(config, ctx):
    SEEN["config"] = config


def test_comma_style_lists():
    app = typer.Typer()
    config_command(app, "c", config=CommaConfig, run=comma_run, technique="test.c", help="c", flags=["sizes"],
                   needs_out=False, optional_out=True)
    app.command("other")(lambda: None)
    ok = CliRunner().invoke(app, ["c", "--n", "3,4", "--json"], catch_exceptions=False)
    assert ok.exit_code == 0 and SEEN["config"].sizes == [3, 4]
    bad = CliRunner().invoke(app, ["c", "--n", "3,x"], catch_exceptions=False)
    assert bad.exit_code == 2 and "comma-separated integers" in bad.stderr
