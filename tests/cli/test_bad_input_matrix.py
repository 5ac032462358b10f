"""The bad-input matrix: every command registered in the CLI (found by walking the Typer app, so a new command is
covered without new test code) gets generated cases, each run through the console script's entry point:

- every numeric knob it offers: non-finite values (inf, -inf, nan, 1e999), wrong types, 0 and -1, and the values
  just outside the bounds its config field declares, typed as the flag and through --set; a value the command
  accepts must lie inside a declared range (bounds, a validator that refused the others, or `signed()`);
- --out dangers: an empty directory (used), a non-empty one, a file, a read-only parent, the inside of each input's
  directory, the input itself, a directory containing an input, the three caches (zoo, iclrkit, Hugging Face) and
  a symlink into an input;
- a missing and a corrupt file for each model and data knob.

A refusal must be one line on stderr, exit 2, before the run (the command's run() is replaced by a recorder, so a
refusal that came from anything but validation fails the case), with the inputs byte-identical and neither OUT nor
OUT.partial left behind. An accepted case must reach the run. The value space of each config's numeric fields is
also searched with hypothesis at the config level (tests/unit would be its home, but its cases come from here).
Interrupted runs and --resume: tests/cli/test_resume_matrix.py."""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from testkit import run_iclrkit

# --- the registry ----------------------------------------------------------------------------------------------------


@dataclass
class Leaf:
    path: tuple[str, ...]
    command: Any  # click.Command
    spec: dict | None  # config_command's iclrkit_spec, None for a hand-written command
    params: dict = field(default_factory=dict)  # click parameter name -> parameter

    @property
    def name(self) -> str:
        return " ".join(self.path)

    @property
    def has_out(self) -> bool:
        return "out" in self.params


def _leaves() -> list[Leaf]:
    from cli.main import root_command

    found: list[Leaf] = []

    def walk(command, path):
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, (*path, name))
            return
        callback = getattr(command, "callback", None)
        spec = getattr(callback, "iclrkit_spec", None)
        found.append(Leaf(path, command, spec, {p.name: p for p in command.params}))

    walk(root_command(), ())
    return found


LEAVES = _leaves()
RUNNING = [leaf for leaf in LEAVES if leaf.spec is not None or leaf.has_out]


def test_the_registry_is_walked():
    """Every family is found, and every command that writes --out either comes from a config (config_command) or is
    one of the few hand-written ones this module knows how to drive."""
    names = {leaf.name for leaf in LEAVES}
    assert len(LEAVES) >= 60 and {"eval ppl", "compress obr", "zoo build", "export gguf"} <= names
    hand_written = {leaf.name for leaf in RUNNING if leaf.spec is None}
    assert hand_written <= set(HAND_WRITTEN), f"drive these in HAND_WRITTEN: {hand_written - set(HAND_WRITTEN)}"


# --- the world a case runs in ------------------------------------------------------------------------------------------


@dataclass
class World:
    root: Path
    inputs: Path
    caches: dict[str, Path]
    calls: list

    def digest(self) -> str:
        """Every input and cache file's path and bytes."""
        digest = hashlib.sha256()
        for top in (self.inputs, *self.caches.values()):
            for file in sorted(p for p in top.rglob("*") if p.is_file()):
                digest.update(str(file).encode() + file.read_bytes())
        return digest.hexdigest()


@pytest.fixture()
def world(tmp_path, monkeypatch):
    """Inputs under tmp/inputs, private caches (each holding a file), and every command's run() replaced by a
    recorder that writes one file into --out (the rest of the runner is real: config, checks, atomic --out)."""
    import huggingface_hub.constants as hub_constants
    import torch

    import cli._runner as runner

    caches = {"zoo": tmp_path / "caches" / "zoo", "iclrkit": tmp_path / "caches" / "iclrkit",
              "hf": tmp_path / "caches" / "hf"}
    for name, cache in caches.items():
        cache.mkdir(parents=True)
        (cache / f"{name}-cached.bin").write_bytes(name.encode())
    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(caches["zoo"]))
    monkeypatch.setenv("ICLRKIT_CACHE_DIR", str(caches["iclrkit"]))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(caches["hf"]))
    calls: list = []
    real = runner._execute

    def recorder(config, ctx):
        calls.append(type(config).__name__)
        if ctx.out is not None:
            (Path(ctx.out) / "recorded.txt").write_text("ran")

    def execute(technique, config_cls, flags, common, run, inputs, plan, needs_out, multi_rank):
        return real(technique, config_cls, flags, common, recorder, inputs, plan, needs_out, multi_rank)

    monkeypatch.setattr(runner, "_execute", execute)
    threads = torch.get_num_threads()
    yield World(tmp_path, tmp_path / "inputs", caches, calls)
    torch.set_num_threads(threads)


# --- a command's baseline: arguments that pass validation and reach the run --------------------------------------------


def _plain(annotation):
    from cli._fields import _unwrap_optional

    return _unwrap_optional(annotation)


def _option(leaf: Leaf, name: str) -> str:
    return leaf.params[name].opts[0]


def _make_input(world: World, name: str, kind: str) -> Path:
    folder = world.inputs / name
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "model":
        (folder / "config.json").write_text('{"model_type": "gpt2"}')
        return folder
    path = folder / f"{name}.txt"
    path.write_text("hello world\n")
    return path


def _required_value(annotation) -> str:
    base = _plain(annotation)
    origin = typing.get_origin(base)
    if origin is typing.Literal:
        return str(typing.get_args(base)[0])
    if origin in (list, tuple):
        return _required_value(typing.get_args(base)[0])
    if typing.get_origin(base) is typing.Annotated:
        return _required_value(typing.get_args(base)[0])
    if base in (int, float):
        return "1"
    return "x"


# Hand-written commands: (arguments that pass, {name: input path}) for those with --out; the others (zoo build, info,
# zoo list) write nothing, and only their options' own types are checked.
def _mergekit_baseline(world: World) -> tuple[list[str], dict[str, Path]]:
    models = {f"model{i}": _make_input(world, f"merge-{i}", "model") for i in range(2)}
    yaml = world.inputs / "mergekit" / "linear.yml"
    yaml.parent.mkdir(parents=True, exist_ok=True)
    yaml.write_text("merge_method: linear\nmodels:\n" + "".join(
        f"  - model: {m}\n    parameters:\n      weight: 1.0\n" for m in models.values()))
    return [str(yaml)], models


def _export_baseline(world: World) -> tuple[list[str], dict[str, Path]]:
    run_dir = _make_input(world, "run_dir", "model")
    return [str(run_dir)], {"run_dir": run_dir}


HAND_WRITTEN = {"export gguf": _export_baseline, "export compressed-tensors": _export_baseline,
                "merge mergekit": _mergekit_baseline}


def baseline(leaf: Leaf, world: World) -> tuple[list[str], dict[str, Path]]:
    """(arguments without --out, {knob: input path made for it}) that pass validation for `leaf`."""
    from toolkit.models.inputs import input_kind

    if leaf.spec is None:
        return HAND_WRITTEN[leaf.name](world)
    config, flags = leaf.spec["config"], leaf.spec["flags"]
    args: list[str] = []
    made: dict[str, Path] = {}
    for name, declared in config.model_fields.items():
        if name in leaf.spec["fixed"]:
            continue
        kind = input_kind(name, declared)
        if kind is not None and (name in flags or declared.is_required()):
            made[name] = _make_input(world, name, kind)
            value = str(made[name])
        elif f"{config.__name__}.{name}" in REQUIRED_SETS:
            args += ["--set", f"{name}={REQUIRED_SETS[f'{config.__name__}.{name}']}"]
            continue
        elif declared.is_required():
            value = _required_value(declared.annotation)
        else:
            continue
        if name in flags:
            args += [_option(leaf, name), value]
        else:
            listed = typing.get_origin(_plain(declared.annotation)) in (list, tuple)
            args += ["--set", f"{name}=[{value}]" if listed else f"{name}={value}"]
    return args, made


# Required config keys no flag offers whose structure a generic value cannot fill (Config.field: --set value).
REQUIRED_SETS = {"LMZooConfig.tasks": "{a: {train: embedded}, b: {train: embedded}}",
                 "PassthroughConfig.slices": "[{sources: [{model: zoo:gpt2-tiny, layer_range: [0, 1]}]}]",
                 "RecipeConfig.stages": "[gptq]"}


def _out_args(leaf: Leaf, out: Path) -> list[str]:
    return ["--out", str(out)] if leaf.has_out else []


def _refused(result, world: World, leaf: Leaf, out: Path | None, before: str, *needles: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, f"{leaf.name}: {result}"
    assert len(lines) == 1 and lines[0].startswith("error:"), f"{leaf.name}: {result.stderr}"
    for needle in needles:
        assert needle.search(lines[0]) if isinstance(needle, re.Pattern) else needle in lines[0], \
            f"{leaf.name}: expected {needle!r} in {lines[0]!r}"
    assert not world.calls, f"{leaf.name}: refused only after the run started: {lines[0]}"
    assert world.digest() == before, f"{leaf.name}: an input or cache changed"
    if out is not None:
        assert not Path(str(out) + ".partial").exists(), f"{leaf.name}: {out}.partial left behind"


def _reaches_run(leaf: Leaf, world: World, args: list[str]):
    world.calls.clear()
    result = run_iclrkit([*leaf.path, *args])
    return result


@pytest.mark.parametrize("leaf", RUNNING, ids=[leaf.name for leaf in RUNNING])
def test_baseline_reaches_the_run(leaf, world):
    """The generated arguments pass validation and reach the (recorded) run: every case below starts from them, so a
    refusal there is the case's own."""
    args, _ = baseline(leaf, world)
    out = world.root / "out"
    result = _reaches_run(leaf, world, [*args, *_out_args(leaf, out)])
    assert result.exit_code == 0 and world.calls, f"{leaf.name} {args}: {result}"
    if leaf.has_out:
        assert (out / "recorded.txt").is_file() and (out / "run.json").is_file()


# --- numeric knobs -----------------------------------------------------------------------------------------------------


@dataclass
class Knob:
    name: str  # config field
    flag: str
    kind: type  # int or float
    is_list: bool
    bounds: dict  # ge/gt/le/lt
    signed: bool
    comma: bool


def _bounds(metadata) -> dict:
    found = {}
    for item in metadata:
        for key in ("ge", "gt", "le", "lt"):
            if getattr(item, key, None) is not None:
                found[key] = getattr(item, key)
    return found


def numeric_knobs(config: type, names) -> list[Knob]:
    knobs = []
    for name in names:
        declared = config.model_fields[name]
        extra = declared.json_schema_extra if isinstance(declared.json_schema_extra, dict) else {}
        base = _plain(declared.annotation)
        is_list = typing.get_origin(base) in (list, tuple)
        item = typing.get_args(base)[0] if is_list else base
        metadata = list(declared.metadata) if not is_list else []
        if typing.get_origin(item) is typing.Annotated:
            item, *more = typing.get_args(item)
            metadata += [m for extra_meta in more for m in getattr(extra_meta, "metadata", [extra_meta])]
        if typing.get_origin(item) in (typing.Union, types.UnionType):  # float | 'auto'
            numeric = [a for a in typing.get_args(item) if a in (int, float) or (
                typing.get_origin(a) is typing.Annotated and typing.get_args(a)[0] in (int, float))]
            if not numeric:
                continue
            item = numeric[0]
            if typing.get_origin(item) is typing.Annotated:
                item, *more = typing.get_args(item)
                metadata += [m for extra_meta in more for m in getattr(extra_meta, "metadata", [extra_meta])]
        if item not in (int, float):
            continue
        from toolkit.core.config import flag_of

        knobs.append(Knob(name, flag_of(config, name), item, is_list, _bounds(metadata), bool(extra.get("signed")),
                          extra.get("style") == "comma"))
    return knobs


def _outside(knob: Knob) -> list[str]:
    """Values just outside the declared bounds."""
    values = []
    step = (lambda v, d: v + d) if knob.kind is int else (lambda v, d: math.nextafter(v, math.inf if d > 0 else
                                                                                         -math.inf))
    if "ge" in knob.bounds:
        values.append(step(knob.bounds["ge"], -1))
    if "gt" in knob.bounds:
        values.append(knob.bounds["gt"])
    if "le" in knob.bounds:
        values.append(step(knob.bounds["le"], 1))
    if "lt" in knob.bounds:
        values.append(knob.bounds["lt"])
    return [repr(knob.kind(v)) if knob.kind is float else str(int(v)) for v in values]


def _inside(knob: Knob, value: float) -> bool:
    b = knob.bounds
    return not (("ge" in b and value < b["ge"]) or ("gt" in b and value <= b["gt"]) or
                ("le" in b and value > b["le"]) or ("lt" in b and value >= b["lt"]))


def _names(knob: Knob) -> re.Pattern:
    """A refusal names the knob: its flag, or its config key (quoted, maybe with a list index)."""
    return re.compile(rf"(?<![\w-]){re.escape(knob.flag)}(?![\w-])|'{re.escape(knob.name)}[.'\s]")


def _names_in_words(knob: Knob) -> re.Pattern:
    """As _names, or a validator's own words for the field (`width 3 must be even`, `mask ratios must ...`)."""
    words = re.escape(knob.name.replace("_", " "))
    return re.compile(rf"{_names(knob).pattern}|\b{re.escape(knob.name)}\b|\b{words}")


SPEC_LEAVES = [leaf for leaf in LEAVES if leaf.spec is not None]


@pytest.mark.parametrize("leaf", SPEC_LEAVES, ids=[leaf.name for leaf in SPEC_LEAVES])
def test_numeric_knobs(leaf, world):
    args, _ = baseline(leaf, world)
    knobs = numeric_knobs(leaf.spec["config"], leaf.spec["flags"])
    out = world.root / "out"
    before = world.digest()
    checked = 0
    for knob in knobs:
        rest = _without(args, knob.flag)
        wrong = ["abc", *(["1.5", "inf", "nan"] if knob.kind is int else [])]
        non_finite = ["inf", "-inf", "nan", "1e999"] if knob.kind is float else []
        refuse = wrong + non_finite + _outside(knob)
        maybe = ["0", "-1"]
        for value in refuse + maybe:
            shutil.rmtree(out, ignore_errors=True)
            result = _reaches_run(leaf, world, [*rest, knob.flag, value, *_out_args(leaf, out)])
            must_refuse = value in refuse
            if result.exit_code == 0:
                assert not must_refuse, f"{leaf.name} {knob.flag} {value}: accepted"
                assert knob.bounds or knob.signed, (
                    f"{leaf.name} {knob.flag} {value} is accepted, but the field {knob.name} declares no range: give "
                    "it bounds (Field(ge=..., gt=...)) or, if every value means something, json_schema_extra=signed()")
                assert world.calls, f"{leaf.name} {knob.flag} {value}: exit 0 without a run"
            else:
                _refused(result, world, leaf, out if leaf.has_out else None, before, _names(knob))
                assert not out.exists()
            checked += 1
        for value in [*non_finite[:1], ".nan" if knob.kind is float else "abc", *_outside(knob)[:1]]:
            result = _reaches_run(leaf, world, [*rest, "--set", f"{knob.name}={value}", *_out_args(leaf, out)])
            _refused(result, world, leaf, out if leaf.has_out else None, before, _names(knob))
            checked += 1
    assert checked >= 6 * len(knobs)


def _without(args: list[str], flag: str) -> list[str]:
    """`args` without `flag VALUE` (a baseline may already give the knob)."""
    out, skip = [], False
    for i, token in enumerate(args):
        if skip:
            skip = False
            continue
        if token == flag:
            skip = True
            continue
        out.append(token)
    return out


def _click_numeric(leaf: Leaf) -> list:
    """The numeric options a command's own Click declaration types (not from its config): --seed, and every numeric
    option of a hand-written command."""
    flags = set(leaf.spec["flags"]) if leaf.spec else set()
    found = []
    for param in leaf.params.values():
        descriptor = getattr(param, "type_descriptor", None)
        annotation = getattr(descriptor, "annotation", None)
        if annotation in (int, float) and param.name not in flags and getattr(param, "opts", None):
            found.append(param)
    return found


CLICK_LEAVES = [leaf for leaf in LEAVES if _click_numeric(leaf)]


@pytest.mark.parametrize("leaf", CLICK_LEAVES, ids=[leaf.name for leaf in CLICK_LEAVES])
def test_numeric_options_declared_on_the_command(leaf, world):
    """A numeric option that no config declares (--seed; a hand-written command's) declares its range on the option
    itself (typer.Option(min=..., max=...), or a validating callback's `iclrkit_range`): every value out of it, each
    non-finite and each wrong type is refused by the option, naming it, before anything runs."""
    before = world.digest()
    for param in _click_numeric(leaf):
        info = param.type_descriptor.parameter_info
        flag = param.opts[0]
        low, high = getattr(info.callback, "iclrkit_range", (info.min, info.max))
        assert low is not None or high is not None, (f"{leaf.name} {flag}: declare its range on the option "
                                                     "(typer.Option(min=..., max=...), or a callback's iclrkit_range)")
        values = ["abc", "inf", "nan", "-inf", *(["1.5"] if param.type_descriptor.annotation is int else [])]
        if low is not None:
            values.append(str(low - 1))
        if high is not None:
            values.append(str(high + 1))
        for value in values:
            world.calls.clear()
            args = [*leaf.path, *(["gpt2-tiny"] if leaf.path == ("zoo", "build") else []), flag, value]
            _refused(run_iclrkit(args), world, leaf, None, before, re.compile(re.escape(flag)))


# --- --out dangers -----------------------------------------------------------------------------------------------------

OUT_LEAVES = [leaf for leaf in RUNNING if leaf.has_out]


@pytest.fixture(scope="module")
def read_only_parent(tmp_path_factory):
    """A directory nothing can be written into (chmod 0555; for root a read-only tmpfs), or None where neither works."""
    path = tmp_path_factory.mktemp("ro")
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        yield None
        return
    yield path
    subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("leaf", OUT_LEAVES, ids=[leaf.name for leaf in OUT_LEAVES])
def test_out_dangers(leaf, world, read_only_parent):
    args, made = baseline(leaf, world)
    before = world.digest()

    def refused(out: Path, *extra: str, needle: str | re.Pattern = "--out") -> None:
        world.calls.clear()
        existed = out.exists()
        result = run_iclrkit([*leaf.path, *args, "--out", str(out), *extra])
        _refused(result, world, leaf, out, before, needle)
        if not existed:
            assert not out.exists() or out.is_symlink(), f"{leaf.name}: {out} appeared"

    # an existing empty directory is used
    empty = world.root / "empty"
    empty.mkdir()
    result = _reaches_run(leaf, world, [*args, "--out", str(empty)])
    assert result.exit_code == 0 and (empty / "recorded.txt").is_file(), f"{leaf.name}: {result}"
    assert not (world.root / "empty.partial").exists()
    # a non-empty directory iclrkit did not write, with and without --overwrite; a file
    foreign = world.root / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    refused(foreign, needle="not empty")
    refused(foreign, "--overwrite", needle="not an iclrkit output")
    assert (foreign / "mine.txt").read_text() == "keep"
    a_file = world.root / "a-file"
    a_file.write_text("keep")
    refused(a_file, needle="file")
    assert a_file.read_text() == "keep"
    # where nothing can be written
    if read_only_parent is not None:
        refused(read_only_parent / f"{leaf.name.replace(' ', '-')}", needle="not writable")
    # each input: inside its directory, the input itself, a directory holding it, a symlink into it
    for knob, path in made.items():
        home = path if path.is_dir() else path.parent
        refused(home / "out", needle="inside")
        refused(path, "--overwrite", needle=re.compile("input|file"))
        refused(home.parent, "--overwrite", needle="contains")
        link = world.root / f"link-{knob}"
        link.symlink_to(home, target_is_directory=True)
        refused(link / "out", needle="inside")
    # the three caches, inside and (with --overwrite) the cache itself
    for cache in world.caches.values():
        refused(cache / "out", needle="cache")
        refused(cache, "--overwrite", needle="cache")
    assert world.digest() == before


# --- missing and corrupt inputs ----------------------------------------------------------------------------------------

def _input_knobs(leaf: Leaf) -> dict[str, str]:
    from toolkit.models.inputs import input_fields

    return {name: kind for name, kind in input_fields(leaf.spec["config"]).items() if name in leaf.spec["flags"]}


INPUT_LEAVES = [leaf for leaf in SPEC_LEAVES if _input_knobs(leaf)]


@pytest.mark.parametrize("leaf", INPUT_LEAVES, ids=[leaf.name for leaf in INPUT_LEAVES])
def test_missing_and_corrupt_inputs(leaf, world):
    args, made = baseline(leaf, world)
    out = world.root / "out"
    for name, kind in _input_knobs(leaf).items():
        flag = _option(leaf, name)
        rest = _without(args, flag)
        cases = {"missing": world.root / "nowhere" / ("model" if kind == "model" else "data.txt")}
        broken = world.root / f"broken-{name}"
        broken.mkdir()
        if kind == "model":
            (broken / "config.json").write_text("{not json")
            cases["corrupt config.json"] = broken
            truncated = world.root / f"truncated-{name}"
            truncated.mkdir()
            (truncated / "config.json").write_text("{}")
            (truncated / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\": {\"dtype\":")
            cases["truncated safetensors"] = truncated
        else:
            (broken / "data.txt").write_bytes(bytes(range(128, 256)) * 64)
            cases["binary text"] = broken / "data.txt"
        before = world.digest()
        for case, value in cases.items():
            result = _reaches_run(leaf, world, [*rest, flag, str(value), *_out_args(leaf, out)])
            needle = str(value) if case != "truncated safetensors" else "corrupt safetensors"
            _refused(result, world, leaf, out if leaf.has_out else None, before, needle)
            assert not out.exists(), f"{leaf.name} {flag} {case}"


# --- the value space, searched (config level: fast, so hypothesis can try many values) ---------------------------------

CONFIGS = sorted({leaf.spec["config"] for leaf in SPEC_LEAVES}, key=lambda c: f"{c.__module__}.{c.__name__}")


@pytest.mark.parametrize("config", CONFIGS, ids=[c.__name__ for c in CONFIGS])
def test_numeric_fields_hold_their_bounds_for_any_value(config):
    """For every numeric field of every command's config (typed as a flag or only reachable by --set/--config): a
    non-finite value is refused, a value outside the declared bounds is refused, and every refusal names the field;
    a value inside them is accepted or refused by a validator that names it."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from toolkit.core.config import resolve_config
    from toolkit.core.errors import BadInputError

    knobs = numeric_knobs(config, list(config.model_fields))
    if not knobs:
        pytest.skip(f"{config.__name__} has no numeric field")
    import yaml

    required = {name: yaml.safe_load(REQUIRED_SETS[f"{config.__name__}.{name}"])
                if f"{config.__name__}.{name}" in REQUIRED_SETS else _typed_value(f.annotation)
                for name, f in config.model_fields.items()
                if f.is_required() or f"{config.__name__}.{name}" in REQUIRED_SETS}
    values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6),
                       st.sampled_from([0, -1, 1, 0.0, -0.0, 1e-300, 1e300]))

    @settings(max_examples=12 * len(knobs), deadline=None, database=None, derandomize=True)
    @given(knob=st.sampled_from(knobs), value=values)
    def check(knob, value):
        if knob.kind is int and isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                typed: Any = value  # not an integer: refused
            else:
                typed = int(value)
        else:
            typed = value
        given_value = [typed] if knob.is_list else typed
        try:
            resolve_config(config, None, None, {**required, knob.name: given_value})
            accepted = True
        except BadInputError as exc:
            accepted = False
            assert _names_in_words(knob).search(exc.message), exc.message
        number = float(typed)
        integral = knob.kind is float or (math.isfinite(number) and number == int(number))
        if not math.isfinite(number) or not integral or not _inside(knob, number):
            assert not accepted, f"{config.__name__}.{knob.name}={typed!r} accepted"

    for knob in knobs:  # the edges every field must hold, whatever hypothesis draws
        for value in (math.inf, -math.inf, math.nan, 0, -1):
            check.hypothesis.inner_test(knob=knob, value=value)
    check()


def _typed_value(annotation):
    text = _required_value(annotation)
    base = _plain(annotation)
    if typing.get_origin(base) in (list, tuple):
        return [int(text) if text.lstrip("-").isdigit() else text]
    return int(text) if text.lstrip("-").isdigit() else text
