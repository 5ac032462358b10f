import sys

import pytest
from pydantic import BaseModel

from toolkit.core.errors import BadInputError
from toolkit.core.registry import Registry, declare, registry, stages


class _Opts(BaseModel):
    sparsity: float = 0.5


def test_register_get_and_metadata():
    reg = Registry("toy")

    @reg.register("double", config=_Opts, needs_hessian=False)
    def double(x):
        return 2 * x

    entry = reg.get("double")
    assert entry.obj(3) == 6 and entry.config is _Opts and entry.needs_hessian is False
    assert "double" in reg and reg.names() == ["double"]
    with pytest.raises(AttributeError):
        entry.missing_key  # noqa: B018


def test_unknown_name_is_one_bad_input_line_listing_the_known():
    reg = Registry("toy")
    reg.register("a")(object())
    with pytest.raises(BadInputError, match="unknown toy method 'b'") as info:
        reg.get("b")
    assert "known: a" in info.value.one_line()


def test_duplicate_names_are_refused_unless_replaced():
    reg = Registry("toy")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    reg.register("a", replace=True)(lambda: 3)
    assert reg.get("a").obj() == 3


def test_declared_modules_are_imported_lazily_on_first_lookup(tmp_path, monkeypatch):
    (tmp_path / "iclrkit_test_plugin.py").write_text(
        "from toolkit.core.registry import register\n"
        "register('lazy-kind', 'plugged')(object())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    declare("lazy-kind", "iclrkit_test_plugin")
    assert "iclrkit_test_plugin" not in sys.modules
    assert registry("lazy-kind").names() == ["plugged"]
    assert "iclrkit_test_plugin" in sys.modules
    sys.modules.pop("iclrkit_test_plugin", None)


def test_stage_lists_resolve_with_validated_options():
    reg = registry("stage-kind")
    reg.register("prune", config=_Opts)(object())
    reg.register("quant")(object())
    resolved = stages("stage-kind", [{"prune": {"sparsity": 0.25}}, "quant"])
    assert [(e.name, o) for e, o in resolved] == [("prune", {"sparsity": 0.25}), ("quant", {})]
    with pytest.raises(BadInputError, match="unknown option"):
        stages("stage-kind", [{"prune": {"density": 0.5}}])
    with pytest.raises(BadInputError, match="unknown stage-kind method 'nope'"):
        stages("stage-kind", ["nope"])
    with pytest.raises(BadInputError, match="names no stage"):
        stages("stage-kind", [])
