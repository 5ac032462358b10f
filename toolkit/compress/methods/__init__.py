"""The registered compression methods, one module each (`@register("compress", NAME, config=..., ...)`).

Every module in this package is imported on the first lookup of the "compress" registry, so a new method is one
file here (and its test): `iclrkit compress NAME` and YAML recipes find it by name. Metadata each method declares:
`needs_hessian` (the damped Hessian is built for it), `stack_rows` (linears sharing an input may be solved as one
row-stacked problem), `help` and `flags` (the config fields offered as command-line options)."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
