"""The registered edit methods, one module each (`@register("edit", NAME, config=..., ...)`).

Every module in this package is imported on the first lookup of the "edit" registry, so a new method is one file
here (and its test): `iclrkit edit NAME` finds it by name and `toolkit.edit.run.run` runs it. An edit method is
MEMIT's pipeline (keys, values, closed-form insertion) with its own value strategy: the registered function is a
values.EditMethod — it takes the method's config and returns the extra per-request loss on δ (a
values.ValueAlignment: `sequential`, `begin_batch`, `loss`, `record`, all edit/run.py and optimise_values call), or
None for MEMIT's plain objective. Metadata each method declares: `paper` (the model card's link), `help`, `epilog` and `flags`
(the config fields offered as command-line options). Modules here import no torch at the top: the CLI imports
them to build its commands."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
