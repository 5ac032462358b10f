"""The registered formal explainers, one module each (`@register("explain", NAME, config=..., ...)`): FAME and its
VeriX/VERIX+ baseline share the images, the ε-box, the attack and the MILP check (config.FormalConfig); each adds
its own search knobs.

Every module in this package is imported on the first lookup of the "explain" registry (toolkit/explain/config.py
declares it), so a new explainer is one file here and its test: `iclrkit explain NAME` with its --config, --dry-run
and run.json. An explainer is a toolkit.explain.config.Explainer, `run(config, ctx) -> dict` (its config a
FormalConfig subclass); metadata: `flags` (its own knobs, added to the shared ones), `help`, `epilog`. Modules here
import no torch at the top: the CLI imports them to build its commands."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
