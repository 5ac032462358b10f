"""compress with onload=true: blocks read from the shards one at a time give the resident run's weights bit for bit."""

import json

import pytest
import torch

from toolkit.core.context import RunContext
from toolkit.core.errors import BadInputError
from toolkit.models.lazy import SafetensorsIndex


@pytest.mark.parametrize("method", ["gptq", "obr"])
def test_onload_compress_equals_resident(method, sharded_llama, tmp_path):
    from toolkit.compress.config import GptqConfig
    from toolkit.compress.obr import ObrConfig
    from toolkit.compress.recipe import run_compress

    cls = GptqConfig if method == "gptq" else ObrConfig
    common = dict(model=str(sharded_llama), data="embedded", nsamples=4, seqlen=32, rotate=False, export="dense",
                  w_bits=4, sparsity=0.5)
    resident = RunContext(out=tmp_path / "resident", quiet=True)
    run_compress(cls(**common), resident)
    onloaded = RunContext(out=tmp_path / "onloaded", quiet=True)
    run_compress(cls(**common, onload=True), onloaded)
    assert onloaded.metrics["onload"] is True and len(onloaded.metrics["seconds_per_block"]) == 3
    assert onloaded.metrics["sparsity"] == resident.metrics["sparsity"]
    want, got = SafetensorsIndex(tmp_path / "resident" / "model"), SafetensorsIndex(tmp_path / "onloaded" / "model")
    assert set(got.names()) == set(want.names())
    for name in want.names():
        assert torch.equal(got.get(name), want.get(name)), name
    config = json.loads((tmp_path / "onloaded" / "model" / "config.json").read_text())
    assert config["iclrkit"]["onload"] is True
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(tmp_path / "onloaded" / "model")
    AutoTokenizer.from_pretrained(tmp_path / "onloaded" / "model")


def test_onload_plan_and_refusals(sharded_llama, tmp_path):
    from toolkit.compress.config import GptqConfig
    from toolkit.compress.recipe import plan, run_compress

    config = GptqConfig(model=str(sharded_llama), nsamples=4, seqlen=32, onload=True)
    details = plan(config, RunContext(quiet=True))
    assert details["onload"] and details["memory"]["blocks"] == 3 and "cpu" in details["memory"]["peak_mb"]
    with pytest.raises(BadInputError, match="rotate=true"):
        run_compress(GptqConfig(model=str(sharded_llama), onload=True, rotate=True), RunContext(quiet=True))
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "config.json").write_text((sharded_llama / "config.json").read_text())
    with pytest.raises(BadInputError, match="safetensors"):
        run_compress(GptqConfig(model=str(tmp_path / "single"), onload=True), RunContext(quiet=True))
