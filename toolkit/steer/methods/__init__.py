"""The registered direction estimators, one module each (`@register("steer", NAME, paired=..., help=...)`).

Every module in this package is imported on the first lookup of the "steer" registry (toolkit/steer/__init__.py declares
it), so a new estimator is one file here and its test: `iclrkit steer NAME` (with --config, --dry-run, run.json),
`steer sweep --method NAME` and the split-half stability find it by name. An estimator is a
toolkit.steer.estimators.Estimator: `fn(undesired, neutral, pair_index) -> v` on (n, d) activation matrices (rows of
a paired estimator come from topic-matched pairs, row i of both). Metadata: `paired` (it sees only the pairs, and
the split-half stability splits pairs; else every example, halved independently), `help`. Modules here import no
torch at the top: the CLI imports them to build its commands."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
