import pytest

from toolkit.core.config import BaseConfig, parse_set, resolve_config
from toolkit.core.errors import BadInputError


class DemoConfig(BaseConfig):
    lr: float = 0.1
    steps: int = 10
    name: str = "a"


def test_precedence_defaults_yaml_set_flags(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("lr: 0.5\nsteps: 20\nname: yaml\n")
    config = resolve_config(DemoConfig, yaml_file, ["steps=30", "name=set"], {"name": "flag", "lr": None})
    assert (config.lr, config.steps, config.name) == (0.5, 30, "flag")
    assert resolve_config(DemoConfig).steps == 10


def test_unknown_key_and_bad_value_are_bad_input(tmp_path):
    with pytest.raises(BadInputError, match="unknown config key 'stepz'"):
        resolve_config(DemoConfig, sets=["stepz=3"])
    with pytest.raises(BadInputError, match="steps"):
        resolve_config(DemoConfig, flags={"steps": "many"})


def test_malformed_and_non_mapping_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1, 2\n")
    with pytest.raises(BadInputError, match="malformed YAML"):
        resolve_config(DemoConfig, bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(BadInputError, match="mapping"):
        resolve_config(DemoConfig, listing)
    with pytest.raises(BadInputError, match="not found"):
        resolve_config(DemoConfig, tmp_path / "missing.yaml")


def test_parse_set_nested_and_typed():
    assert parse_set(["a.b=3", "c=true", "d=x"]) == {"a": {"b": 3}, "c": True, "d": "x"}
    with pytest.raises(BadInputError):
        parse_set(["novalue"])
