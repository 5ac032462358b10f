"""The QuaRot-style rotation (toolkit/compress/rotation.py) as a whole-model recipe stage: [rotate, gptq] is
`compress gptq --rotate`, [rotate, obr] is `compress obr`. Refused where the rotation is not exact
(rotation.rotation_refusal, one line, exit 2). A method that rotates (its `rotate` knob) runs this same stage."""

from toolkit.compress.config import CompressConfig
from toolkit.core.registry import register


@register("compress-stage", "rotate", config=CompressConfig, role="transform",
          knobs=["rotation_seed", "rotation_kind"],
          help="QuaRot rotation of the residual stream, V/O heads and down_proj's input (RMSNorm pre-norm models).")
def rotate(view, windows, stage_config, run_config, ctx) -> dict:
    from toolkit.compress.rotation import rotate_model

    rotation = rotate_model(view, stage_config.rotation_seed, online_o_proj=run_config.a_bits < 16,
                            kind=stage_config.rotation_kind)
    ctx.metrics["hadamard"] = rotation["hadamard"]  # per rotation: "exact" | "kron-orthogonal"
    return {"rotation": rotation}
