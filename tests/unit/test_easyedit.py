"""EasyEdit interop: KnowEdit's nested locality/portability, MQuAKE refused by name, EasyEdit hparams YAML resolved
to the same config as the equivalent iclrkit YAML, per-record results.jsonl beside run.json."""

from __future__ import annotations

import json
import logging

import pytest

from toolkit.core.config import resolve_config
from toolkit.core.errors import BadInputError
from toolkit.edit.config import MemitConfig
from toolkit.edit.eamet import EametConfig
from toolkit.edit.easyedit import translate, translate_file
from toolkit.edit.facts import load_facts

# the shapes of KnowEdit's benchmark_wiki_recent / wiki_counterfact / WikiBio records (examples/KnowEdit.md)
KNOWEDIT = [
    {"subject": "Leo Arons", "prompt": "The place of death of Leo Arons is", "target_new": "Berlin",
     "portability": {"Logical_Generalization": [{"prompt": "Is Leo Arons still alive?",
                                                 "ground_truth": [["no"], ["incorrect"], ["false"]]}],
                     "Reasoning": [{"prompt": "The continent of the place of death of Leo Arons is",
                                    "ground_truth": [["Europe", "European continent"]]}],
                     "Subject_Aliasing": [{"prompt": "The place of death of Martin Leo Arons is",
                                           "ground_truth": [["Berlin", "Berlin, Germany"]]}]},
     "locality": {"Relation_Specificity": [{"prompt": "The name of the father of Leo Arons is",
                                            "ground_truth": [["Albert Arons"]]},
                                           {"prompt": "The field of work of Leo Arons is",
                                            "ground_truth": [["experimental physics"]]}]}},
    {"subject": "Frederic Piesch", "prompt": "The name of the position held by Frederic Piesch is",
     "target_new": "Archbishop of León, Mexico", "ground_truth": "mayor of Vienna",
     "portability": {"Subject_Aliasing": [{"prompt": "The position held by Frederic of Pieschen is",
                                           "ground_truth": "Archbishop of León, Mexico"}]},
     "locality": {"Relation_Specificity": [{"prompt": "The gender of Frederic Piesch is", "ground_truth": "male"}],
                  "Forgetfulness": [{"prompt": "The position held by Frederic Piesch, which is not X, is",
                                     "ground_truth": "mayor of Vienna"}]}},
    {"text": "This is a Wikipedia passage about john russell reynolds. He was a neurologist.",
     "labels": "He received general education from his father.", "concept": "john russell reynolds",
     "locality": {"Relation_Specificity": [{"prompt": "The field of work of john russell reynolds is",
                                            "ground_truth": ["medicine"]}]}},
]

MQUAKE = [{"case_id": 1, "requested_rewrite": [
    {"prompt": "{} is a citizen of", "subject": "Ellie Kemper", "target_new": {"str": "Croatia"},
     "target_true": {"str": "United States of America"}, "question": "What is the country of citizenship of "
                                                                     "Ellie Kemper?"}],
    "questions": ["What is the capital of the country Ellie Kemper is a citizen of?"],
    "answer": "Washington, D.C.", "new_answer": "Zagreb",
    "single_hops": [], "new_single_hops": []}]

# EasyEdit's hparams/MEMIT/gpt2-xl.yaml, with its own spellings (5e-1 is a string to YAML 1.1)
MEMIT_HPARAMS = """alg_name: "MEMIT"
model_name: "./hugging_cache/gpt2-xl"
stats_dir: "./data/stats"
device: 0
layers: [13, 14, 15, 16, 17]
clamp_norm_factor: 0.75
layer_selection: "all"
fact_token: "subject_last"
v_num_grad_steps: 20
v_lr: 5e-1
v_loss_layer: 47
v_weight_decay: 0.5
kl_factor: 0.0625
mom2_adjustment: true
mom2_update_weight: 20000
rewrite_module_tmp: "transformer.h.{}.mlp.c_proj"
layer_module_tmp: "transformer.h.{}"
mlp_module_tmp: "transformer.h.{}.mlp"
attn_module_tmp: "transformer.h.{}.attn"
ln_f_module: "transformer.ln_f"
lm_head_module: "transformer.wte"
mom2_dataset: "wikipedia"
mom2_n_samples: 100000
mom2_dtype: "float32"
model_parallel: false
"""

ICLRKIT_EQUIVALENT = """model: ./hugging_cache/gpt2-xl
stats_dir: ./data/stats
layers: [13, 14, 15, 16, 17]
clamp: h
clamp_factor: 0.75
v_num_grad_steps: 20
v_lr: 0.5
v_weight_decay: 0.5
kl_factor: 0.0625
mom2_update_weight: 20000.0
"""


def _write(path, data):
    path.write_text(json.dumps(data, ensure_ascii=False))
    return path


def test_knowedit_locality_and_portability_are_read(tmp_path):
    facts = load_facts(_write(tmp_path / "knowedit.json", KNOWEDIT))
    recent, counterfact, wikibio = facts
    assert recent.prompt == "The place of death of {} is" and recent.target_new == "Berlin"
    assert recent.neighborhood == [("The name of the father of Leo Arons is", "Albert Arons"),
                                   ("The field of work of Leo Arons is", "experimental physics")]
    assert ("Is Leo Arons still alive?", "no") in recent.portability
    assert ("The continent of the place of death of Leo Arons is", "Europe") in recent.portability
    assert len(recent.portability) == 3
    assert counterfact.target_new == "Archbishop of León, Mexico" and counterfact.target_true == "mayor of Vienna"
    assert counterfact.neighborhood[-1] == ("The position held by Frederic Piesch, which is not X, is",
                                            "mayor of Vienna")  # Forgetfulness counts as locality
    assert wikibio.subject == "john russell reynolds" and "{}" in wikibio.prompt
    assert wikibio.neighborhood == [("The field of work of john russell reynolds is", "medicine")]


def test_mquake_records_are_refused_by_name(tmp_path):
    with pytest.raises(BadInputError, match="MQuAKE"):
        load_facts(_write(tmp_path / "mquake.json", MQUAKE))


def test_easyedit_memit_hparams_resolve_like_the_iclrkit_yaml(tmp_path, caplog):
    hparams = tmp_path / "gpt2-xl.yaml"
    hparams.write_text(MEMIT_HPARAMS)
    plain = tmp_path / "iclrkit.yaml"
    plain.write_text(ICLRKIT_EQUIVALENT)
    with caplog.at_level(logging.WARNING, logger="iclrkit.edit"):
        values, unmapped = translate_file(hparams, "memit")
    translated = tmp_path / "translated.yaml"
    import yaml

    translated.write_text(yaml.safe_dump(values))
    ours = resolve_config(MemitConfig, translated, None, {"data": "facts.json"})
    expect = resolve_config(MemitConfig, plain, None, {"data": "facts.json"})
    assert ours == expect and ours.v_lr == 0.5 and ours.mom2_update_weight == 20000.0
    warning = " ".join(r.getMessage() for r in caplog.records)
    for key in ("mom2_dataset", "mom2_n_samples", "v_loss_layer", "rewrite_module_tmp", "device"):
        assert key in unmapped and key in warning


def test_easyedit_eamet_hparams(tmp_path):
    data = {"alg_name": "EAMET", "model_name": "m", "layers": [4, 5], "v_lr": "5e-1", "clamp_norm_factor": 4,
            "clamp_ks_factor": 1, "cs_factor": 1, "mse_factor": 1, "tau": 0.07, "norm_factor": 0.0,
            "v_weight_decay": "1e-3", "delta_init": "target_init", "weight_decay_method": "fix_ks",
            "mom2_update_weight": [15000, 15000], "kl_factor": 0.0625}
    values, unmapped = translate(data, "eamet")
    config = EametConfig(data="f.json", **values)
    assert (config.clamp, config.clamp_factor, config.v_weight_decay, config.init) == ("ks", 1.0, 0.0, "target")
    assert config.mom2_update_weight == 15000.0 and config.cs_factor == 1 and config.v_lr == 0.5
    assert "clamp_norm_factor" in unmapped and "v_weight_decay" in unmapped


@pytest.mark.parametrize("data, command, message", [
    ({"alg_name": "ROME", "layers": [5]}, "memit", "alg_name 'ROME' has no iclrkit equivalent"),
    ({"alg_name": "EAMET"}, "memit", "EAMET file, but this is `iclrkit edit memit`"),
    ({"alg_name": "MEMIT", "fact_token": "last"}, "memit", "fact_token 'last'"),
    ({"alg_name": "EAMET", "mom2_update_weight": [1, 2]}, "eamet", "differ"),
])
def test_bad_hparams(data, command, message):
    with pytest.raises(BadInputError, match=message):
        translate(data, command)
