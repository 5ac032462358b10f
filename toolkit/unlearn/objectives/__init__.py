"""The registered unlearning objectives, one module each (`@register("unlearn", NAME, config=..., ...)`).

Every module in this package is imported on the first lookup of the "unlearn" registry, so a new objective is one
torch-free file here (its config, its setup function — heavy imports inside it — and its registration) plus its
test: `iclrkit unlearn NAME` and `method: NAME` in a YAML config find it by name. The setup contract and the
metadata are described in toolkit/unlearn/run.py."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
