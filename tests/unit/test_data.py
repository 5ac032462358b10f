import json

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.data.text import calibration_windows, embedded_text, load_text, read_jsonl, split_text


def test_embedded_text_is_python_documentation():
    text = load_text("embedded")
    assert len(text) > 100_000 and "statement" in text and text == embedded_text()


def test_txt_and_jsonl_sources(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    assert load_text(str(tmp_path / "a.txt")) == "hello world"
    rows = [{"text": "one", "body": "x"}, {"text": "two", "body": "y"}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert load_text(str(tmp_path / "b.jsonl")) == "one\n\ntwo"
    assert load_text(f"{tmp_path / 'b.jsonl'}:body") == "x\n\ny"


def test_bad_data_sources(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(BadInputError, match="empty"):
        load_text(str(tmp_path / "empty.txt"))
    with pytest.raises(BadInputError, match="not found"):
        load_text(str(tmp_path / "missing.txt"))
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(BadInputError, match="cannot read"):
        load_text(str(tmp_path / "binary.txt"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(BadInputError, match="bad.jsonl:2: malformed JSON"):
        read_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "nofield.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(BadInputError, match="no field 'text'"):
        load_text(str(tmp_path / "nofield.jsonl"))


def test_calibration_windows_shape_and_determinism(tiny_tokenizer):
    text = embedded_text()[:20_000]
    a = calibration_windows(tiny_tokenizer, text, n=4, seqlen=32, seed=1)
    b = calibration_windows(tiny_tokenizer, text, n=4, seqlen=32, seed=1)
    assert a.shape == (4, 32) and a.dtype == torch.long and torch.equal(a, b)
    assert not torch.equal(a, calibration_windows(tiny_tokenizer, text, n=4, seqlen=32, seed=2))
    with pytest.raises(BadInputError, match="shorter than one window"):
        calibration_windows(tiny_tokenizer, "tiny text", n=1, seqlen=512)


def test_split_is_a_partition():
    text = "\n\n".join(f"paragraph {i}" for i in range(100))
    train, test = split_text(text, test_fraction=0.1, seed=0)
    parts = train.split("\n\n") + test.split("\n\n")
    assert sorted(parts) == sorted(text.split("\n\n")) and len(test.split("\n\n")) == 10
