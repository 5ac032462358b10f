import json

from toolkit.core.records import JsonlWriter, read_json, write_json


def test_write_json_round_trips_atomically(tmp_path):
    path = write_json(tmp_path / "sub" / "results.json", {"rows": [{"ppl": 1.5, "method": "ŌBR"}], "p": tmp_path})
    assert read_json(path) == {"rows": [{"ppl": 1.5, "method": "ŌBR"}], "p": str(tmp_path)}
    assert not list(path.parent.glob(".*.tmp"))


def test_jsonl_writer_flushes_each_record(tmp_path):
    path = tmp_path / "log.jsonl"
    with JsonlWriter(path) as log:
        log.write({"i": 0})
        assert json.loads(path.read_text().splitlines()[0]) == {"i": 0}  # visible before close
        log.write_all({"i": i} for i in (1, 2))
    assert [json.loads(line)["i"] for line in path.read_text().splitlines()] == [0, 1, 2]
    with JsonlWriter(path, append=True) as log:
        log.write({"i": 3})
    assert len(path.read_text().splitlines()) == 4


def test_model_cards_name_the_real_command_when_none_is_given(tmp_path, monkeypatch):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolkit.core.records import command_line
    from toolkit.models.save import save_model

    monkeypatch.setattr("sys.argv", ["/venv/bin/iclrkit", "merge", "average", "-m", "a b", "-o", "out"])
    assert command_line() == "iclrkit merge average -m 'a b' -o out"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    out = save_model(model, None, tmp_path / "m", technique="merge.average", source="a + b")
    assert "Command: `iclrkit merge average -m 'a b' -o out`" in (out / "README.md").read_text()
