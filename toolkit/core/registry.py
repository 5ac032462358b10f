"""One registry per kind of method: a method is one decorated function (or class) in one file.

    from toolkit.core.registry import register

    @register("compress", "magnitude", config=MagnitudeConfig, needs_hessian=False, flags=BASE_FLAGS, help="...")
    def magnitude(job): ...

`registry("compress").get("magnitude")` gives the entry (its object, config class and metadata); an unknown name is
one BadInputError line that lists the known ones. A kind names the modules whose import registers its built-in
methods (`declare(kind, modules)`, done by each room's torch-free config module: compress, edit, merge, unlearn,
steer, explain; each points at its `methods/` package, which imports every module in it), so lookups import them on
first use and nothing is imported before that (the CLI stays torch-free at import). What a registered object must
be is the room's Protocol (e.g. toolkit.compress.job.CompressMethod, toolkit.merge.common.TensorMethod);
`protocol_members` and `conforms` let the tests hold the runners and the built-ins to it. `stages()` resolves a
list of registered names with options (llm-compressor style), for recipes that compose stages (the compress room's
"compress-stage" registry: toolkit/compress/stages.py).
This module imports nothing above `toolkit.core`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from toolkit.core.errors import BadInputError


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    obj: Any
    config: type | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:  # entry.needs_hessian reads the metadata
        meta = object.__getattribute__(self, "meta")
        if key in meta:
            return meta[key]
        raise AttributeError(key)


class Registry:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._modules: list[str] = []
        self._loaded = False

    def declare(self, *modules: str) -> None:
        """Modules whose import registers the built-in methods (imported lazily, on the first lookup)."""
        self._modules.extend(m for m in modules if m not in self._modules)
        self._loaded = False

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self._modules:
            importlib.import_module(module)

    def register(self, name: str, *, config: type | None = None, replace: bool = False,
                 **meta: Any) -> Callable[[Any], Any]:
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} method needs a non-empty name")

        def decorate(obj: Any) -> Any:
            if name in self._entries and not replace and self._entries[name].obj is not obj:
                raise ValueError(f"{self.kind} method '{name}' is already registered")
            self._entries[name] = Entry(self.kind, name, obj, config, dict(meta))
            return obj

        return decorate

    def get(self, name: str) -> Entry:
        self._load()
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "none"
            raise BadInputError(f"unknown {self.kind} method '{name}'", f"known: {known}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        self._load()
        return iter([self._entries[n] for n in sorted(self._entries)])


def protocol_members(protocol: type) -> set[str]:
    """The public attributes and methods a typing.Protocol declares (what a plug-in must provide and all the runner
    may use); the tests of each room check the runner against it."""
    names = set(vars(protocol).get("__annotations__", {}))
    names |= {n for n, v in vars(protocol).items() if callable(v) and (not n.startswith("_") or n == "__call__")}
    return names


def conforms(obj: Any, protocol: type) -> bool:
    """Whether a registered callable takes the parameters of `protocol.__call__` (same names, in order)."""
    import inspect

    wanted = list(inspect.signature(protocol.__call__).parameters)[1:]
    return list(inspect.signature(obj).parameters)[:len(wanted)] == wanted and \
        len(inspect.signature(obj).parameters) == len(wanted)


_REGISTRIES: dict[str, Registry] = {}


def registry(kind: str) -> Registry:
    if kind not in _REGISTRIES:
        _REGISTRIES[kind] = Registry(kind)
    return _REGISTRIES[kind]


def register(kind: str, name: str, *, config: type | None = None, replace: bool = False,
             **meta: Any) -> Callable[[Any], Any]:
    return registry(kind).register(name, config=config, replace=replace, **meta)


def declare(kind: str, *modules: str) -> None:
    registry(kind).declare(*modules)


def stages(kind: str, spec: Any) -> list[tuple[Entry, dict[str, Any]]]:
    """Resolve a recipe's stage list (llm-compressor style) to (entry, options) pairs.

    `spec` is a name, a list of names, or a list of one-key mappings `{name: {option: value}}`, e.g.
    `[{sparsegpt: {sparsity: 0.5}}, {gptq: {w_bits: 4}}]`. Option names are checked against the entry's `knobs`
    metadata when it declares them, else against its config class's fields (unknown keys are bad input); their
    values are the room's to validate (toolkit/compress/stages.py builds each stage's config from them)."""
    items = [spec] if isinstance(spec, (str, dict)) else list(spec or [])
    if not items:
        raise BadInputError(f"the {kind} recipe names no stage")
    resolved = []
    for item in items:
        if isinstance(item, str):
            name, options = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            name, options = next(iter(item.items()))
            if options is not None and not isinstance(options, dict):
                raise BadInputError(f"{kind} stage '{name}': its options must be a mapping, got {options!r}")
            options = dict(options or {})
        else:
            raise BadInputError(f"a {kind} stage must be a name or a one-key mapping, got {item!r}")
        entry = registry(kind).get(str(name))
        if (entry.config is not None or "knobs" in entry.meta) and options:
            fields = entry.meta.get("knobs", getattr(entry.config, "model_fields", {}))
            unknown = sorted(set(options) - set(fields))
            if unknown:
                raise BadInputError(f"unknown option(s) {', '.join(unknown)} for {kind} '{name}'",
                                    f"known: {', '.join(sorted(fields))}")
        resolved.append((entry, options))
    return resolved
