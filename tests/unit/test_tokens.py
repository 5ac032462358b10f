from types import SimpleNamespace

from toolkit.models.tokens import pad_id


def test_pad_id_prefers_pad_then_eos_then_zero_never_none():
    assert pad_id(SimpleNamespace(pad_token_id=5, eos_token_id=2)) == 5
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=2)) == 2
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=0)) == 0
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0
    assert pad_id(object()) == 0
