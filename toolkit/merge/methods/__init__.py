"""The registered merge methods, one module each (`@register("merge", NAME, config=..., ...)`).

Every module in this package is imported on the first lookup of the "merge" registry (toolkit/merge/config.py
declares it), so a new method is one file here and its test: `iclrkit merge NAME` (with its --config, --dry-run and
run.json), the streamed and in-memory merges and the mergekit translation find it by name.

A tensor-by-tensor method (`tensorwise=True`) is a `toolkit.merge.common.TensorMethod`: `fn(tensors, base, config,
site) -> tensor`, its knobs the fields of its config (a subclass of config.TensorMergeConfig), read at the tensor's
layer position with `site.at(...)` (gradients); `toolkit.merge.common.merge_tensor` calls it, in memory and
streamed, with the tensors already in the compute dtype. A whole-model method (`tensorwise=False`: padded, latent,
passthrough) registers its run(config, ctx). Metadata: `needs_base`, `rowwise` (elementwise, so a streamed merge may
feed it row chunks), `min_models` (besides the base; default 2), `check` (a common.MergeCheck), `record` (config
fields written into the model's config.json), `paper`, `help`, `epilog`, `flags`, `inputs` (fields naming input
paths besides the models), `group`/`command` (a sub-command group), and for the mergekit translation
(toolkit/merge/mergekit.py): `mergekit` (the merge_method it computes) and `mergekit_params` (mergekit parameter ->
(config field, "model" | "global")).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# the flags every same-size tensor merge offers besides its own knobs
COMMON_FLAGS = ["numerics"]
