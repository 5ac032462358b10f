"""Run real mergekit (0.1.5) on one YAML, in ITS OWN venv (not iclrkit's):

    .venv-bench/bin/python examples/merge-mergekit/mergekit_run.py CONFIG.yml OUT_DIR SEED

DARE and DELLA drop task-vector entries at random; mergekit draws the drops from torch's global generator in its
own tensor order, iclrkit from one generator per (seed, tensor, model) so streamed and in-memory merges agree. To
compare the rest of the math, this runner makes mergekit draw each model's drops on each tensor from that same
per-(seed, tensor, model) stream: `toolkit/merge/kernels.py` (loaded from its file: it imports only torch) gives
the draw, and mergekit's sparsify module gets a `torch` whose `bernoulli` calls it. Nothing else is patched.
"""

from __future__ import annotations

import contextvars
import importlib.util
import sys
import types
from pathlib import Path

import torch
import yaml

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("iclrkit_kernels", HERE.parents[1] / "toolkit" / "merge" / "kernels.py")
kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernels)

SITE = contextvars.ContextVar("site")  # (tensor name, [model index of each non-base entry], calls so far)


def patch(seed: int) -> None:
    import mergekit.sparsify as sparsify
    from mergekit.merge_methods.generalized_task_arithmetic import GeneralizedTaskArithmeticMerge

    merge_group = GeneralizedTaskArithmeticMerge.merge_group

    def traced(self, group, /, **parameters):
        order = [entry.id for entry in group.non_base]
        token = SITE.set([group.metadata.name, order, 0])
        try:
            return merge_group(self, group, **parameters)
        finally:
            SITE.reset(token)

    def bernoulli(probs):
        site = SITE.get()
        name, order, calls = site
        site[2] += 1  # merge_group sparsifies the non-base entries in order, one draw each
        return kernels.keep_draw(probs, kernels.generator(seed, name, MODEL_INDEX[order[calls]]))

    GeneralizedTaskArithmeticMerge.merge_group = traced
    fake = types.ModuleType("torch_with_seeded_bernoulli")
    fake.__dict__.update({k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})
    fake.bernoulli = bernoulli
    sparsify.torch = fake


MODEL_INDEX: dict = {}


def main(config_file: str, out: str, seed: int) -> None:
    from mergekit.common import ModelReference
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    text = Path(config_file).read_text()
    data = yaml.safe_load(text)
    base = data.get("base_model")
    non_base = [m["model"] for m in data.get("models") or [] if m["model"] != base]
    MODEL_INDEX.update({ModelReference.model_validate(m): i for i, m in enumerate(non_base)})
    patch(seed)
    run_merge(MergeConfiguration.model_validate(data), out, options=MergeOptions(random_seed=seed, quiet=True,
                                                                                  copy_tokenizer=True),
              config_source=text)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
