"""EasyEdit (github.com/zjunlp/EasyEdit) hyperparameter files translated to iclrkit's MEMIT / EAMET configs.

An EasyEdit hparams YAML (hparams/MEMIT/*.yaml, hparams/EAMET/*.yaml) is recognised by its `alg_name` key. Keys
with an iclrkit equivalent are renamed; keys that describe what iclrkit finds by itself (module templates, the
loss layer, the device) or that have no equivalent are named in one warning; values iclrkit cannot honour (another
fact token, no covariance adjustment, per-layer λ that differ) are refused with one line. Scientific notation
written without a dot (`v_lr: 5e-1`, a string to YAML 1.1) is read as a number, as EasyEdit does.
"""

from __future__ import annotations

import logging
from pathlib import Path

from toolkit.core.errors import BadInputError

log = logging.getLogger("iclrkit.edit")

ALGORITHMS = {"MEMIT": "memit", "EAMET": "eamet"}
# EasyEdit key -> iclrkit key, the same meaning
RENAMED = {"model_name": "model", "layers": "layers", "stats_dir": "stats_dir", "v_num_grad_steps": "v_num_grad_steps",
           "v_lr": "v_lr", "kl_factor": "kl_factor", "mom2_update_weight": "mom2_update_weight"}
EAMET_RENAMED = {"cs_factor": "cs_factor", "mse_factor": "mse_factor", "tau": "tau"}
# located or fixed by iclrkit itself: accepted, named in the warning
LOCATED = ("rewrite_module_tmp", "layer_module_tmp", "mlp_module_tmp", "attn_module_tmp", "ln_f_module",
           "lm_head_module", "v_loss_layer", "device", "model_parallel", "max_length", "mom2_dtype")
# no iclrkit equivalent: named in the warning
NO_EQUIVALENT = {
    "mom2_dataset": "iclrkit's covariance text is cov_data (default: embedded text)",
    "mom2_n_samples": "EasyEdit counts Wikipedia articles; iclrkit counts tokens (cov_tokens)",
    "ks_bs": "iclrkit computes keys in eval_batch chunks",
    "batch_size": "EasyEdit chunks batch_edit by it; iclrkit edits all facts in one update unless batch_size is set",
}


def _number(value):
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def is_easyedit(data: dict) -> bool:
    return isinstance(data, dict) and "alg_name" in data


def translate(data: dict, command: str, where: str = "hparams") -> tuple[dict, list[str]]:
    """EasyEdit hparams dict -> (iclrkit config values, names of the keys without an equivalent).

    `command` is the iclrkit algorithm being run (memit | eamet); the file's alg_name must name it."""
    data = {key: _number(value) for key, value in data.items()}
    algorithm = str(data.get("alg_name", ""))
    if algorithm.upper() not in ALGORITHMS:
        raise BadInputError(f"{where}: EasyEdit alg_name '{algorithm}' has no iclrkit equivalent",
                            f"supported: {', '.join(ALGORITHMS)}")
    if ALGORITHMS[algorithm.upper()] != command:
        raise BadInputError(f"{where} is an EasyEdit {algorithm} file, but this is `iclrkit edit {command}`",
                            f"run `iclrkit edit {ALGORITHMS[algorithm.upper()]} --config {where}`")
    eamet = command == "eamet"
    values: dict = {}
    unmapped: list[str] = []
    for key, value in data.items():
        if key == "alg_name":
            continue
        if key in RENAMED:
            values[RENAMED[key]] = value
        elif eamet and key in EAMET_RENAMED:
            values[EAMET_RENAMED[key]] = value
        elif key == "fact_token":
            if value != "subject_last":
                raise BadInputError(f"{where}: fact_token '{value}' is not supported",
                                    "iclrkit's keys are at the subject's last token (subject_last)")
        elif key == "layer_selection":
            if value != "all":
                raise BadInputError(f"{where}: layer_selection '{value}' is not supported", "iclrkit edits all layers")
        elif key == "mom2_adjustment":
            if value is not True:
                raise BadInputError(f"{where}: mom2_adjustment false (no covariance term) is not supported")
        elif key in ("clamp_norm_factor", "v_weight_decay", "clamp_ks_factor", "norm_factor", "delta_init",
                     "weight_decay_method"):
            continue  # below: their meaning depends on the algorithm
        else:  # LOCATED, NO_EQUIVALENT and keys iclrkit does not know
            unmapped.append(key)
    weight = values.get("mom2_update_weight")
    if isinstance(weight, list):
        if not weight or len(set(float(w) for w in weight)) != 1:
            raise BadInputError(f"{where}: per-layer mom2_update_weight {weight} differ",
                                "iclrkit uses one λ for every edit layer")
        values["mom2_update_weight"] = float(weight[0])
    if not eamet:
        _copy(data, values, "clamp_norm_factor", "clamp_factor")
        _copy(data, values, "v_weight_decay", "v_weight_decay")
        unmapped += [k for k in ("clamp_ks_factor", "norm_factor", "delta_init", "weight_decay_method") if k in data]
    else:
        _eamet_norms(data, values, unmapped, where)
    return values, unmapped


def _copy(data: dict, values: dict, source: str, target: str) -> None:
    if source in data:
        values[target] = data[source]


def _eamet_norms(data: dict, values: dict, unmapped: list[str], where: str) -> None:
    """EasyEdit's EAMET bounds δ one of two ways (weight_decay_method): `fix_ks` projects ‖δ‖ ≤ clamp_ks_factor·‖k‖
    (iclrkit clamp=ks) with a norm_factor penalty iclrkit does not have; `norm` is MEMIT's v_weight_decay with
    ‖δ‖ ≤ clamp_norm_factor·‖h‖ (clamp=h)."""
    method = data.get("weight_decay_method", "fix_ks")
    if method == "fix_ks":
        values["clamp"] = "ks"
        _copy(data, values, "clamp_ks_factor", "clamp_factor")
        values["v_weight_decay"] = 0.0
        if float(data.get("norm_factor") or 0.0) != 0.0:
            unmapped.append("norm_factor")
        unmapped += [k for k in ("clamp_norm_factor", "v_weight_decay") if k in data]
    elif method == "norm":
        values["clamp"] = "h"
        _copy(data, values, "clamp_norm_factor", "clamp_factor")
        _copy(data, values, "v_weight_decay", "v_weight_decay")
        unmapped += [k for k in ("clamp_ks_factor", "norm_factor") if k in data]
    else:
        raise BadInputError(f"{where}: weight_decay_method '{method}' is not supported", "fix_ks | norm")
    init = data.get("delta_init")
    if init is not None:
        if init not in ("target_init", "zero"):
            raise BadInputError(f"{where}: delta_init '{init}' is not supported", "target_init | zero")
        values["init"] = "target" if init == "target_init" else "zero"


def translate_file(path: str | Path, command: str) -> tuple[dict, list[str]]:
    """Read and translate an hparams file; logs one warning naming the keys iclrkit does not use."""
    from toolkit.core.config import load_yaml

    values, unmapped = translate(load_yaml(path), command, where=str(path))
    located = [key for key in unmapped if key in LOCATED]
    other = [f"{key} ({NO_EQUIVALENT[key]})" if key in NO_EQUIVALENT else key for key in unmapped
             if key not in LOCATED]
    parts = ([", ".join(located) + " (iclrkit finds module paths, the loss layer and the device itself)"]
             if located else []) + other
    if parts:
        log.warning("%s: EasyEdit keys with no iclrkit equivalent, not used: %s", path, "; ".join(parts))
    return values, unmapped
