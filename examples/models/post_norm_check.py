"""What the post-feedforward norm does to MEMIT's insertion on a Gemma model (issue 40): per fact, at the subject's
last token of the bare prompt and each edit layer, the rms of the down_proj output m, the norm's |1 + w|, the gain
‖shift‖ / ‖pre-image‖ (how far the residual moves per unit of down_proj output change), and what the pre-image of
half of δ (one of two edit layers' share), applied exactly, produces: its reach (projection on the shift) and its
relative error (the part of the shift no input of the norm can produce).

Diagnostic script, not a test. VALUES is an `edit memit` run's values.safetensors (its δ).

    OMP_NUM_THREADS=1 nice python examples/models/post_norm_check.py --model zoo:gemma3-270m \
        --facts $ICLRKIT_DATA/counterfact/kd-evaluate/counterfact_sample.json -n 10 \
        --values runs/gemma/memit10-postnorm/values.safetensors --layers 3 4
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--facts", required=True)
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--values", required=True)
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 4])
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    from toolkit.edit.context import EditContext
    from toolkit.edit.facts import load_facts
    from toolkit.edit.keys import prompt_rows, subject_states
    from toolkit.models.norms import effective_scale
    from toolkit.models.source import load_model

    model, tokenizer = load_model(args.model)
    model.requires_grad_(False)
    facts = load_facts(args.facts, args.n)
    ectx = EditContext.of(model, tokenizer, "cpu", batch=16)
    shift = load_file(args.values)["delta"].float() / len(args.layers)
    rows = prompt_rows(tokenizer, facts, [""], with_target=False)
    report = {}
    with torch.no_grad():
        for layer in args.layers:
            slot = ectx.view.mlp_out(layer)
            path = ectx.view.output_norm(layer, slot)
            norm = ectx.view.blocks[layer].get_submodule(path)
            m = subject_states(ectx, rows, [ectx.down(layer)], "output")[ectx.down(layer)]
            scale, u = effective_scale(norm, ectx.view.layout(layer).norms[path]), norm(m).float()
            pre = ectx.view.output_shift(layer, slot, m, shift)
            got = norm(m + pre).float() - u
            rounded = lambda t: [round(float(v), 4) for v in t]  # noqa: E731
            report[layer] = {"norm": path, "rms_m": rounded(m.square().mean(-1).sqrt()),
                             "scale_abs_mean": round(float(scale.abs().mean()), 3),
                             "scale_abs_max": round(float(scale.abs().max()), 3),
                             "gain": rounded(shift.norm(dim=-1) / pre.norm(dim=-1)),
                             "reach": rounded((got * shift).sum(-1) / shift.square().sum(-1)),
                             "relative_error": rounded((got - shift).norm(dim=-1) / shift.norm(dim=-1))}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
