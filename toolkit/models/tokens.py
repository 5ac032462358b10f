"""Tokenizer facts every technique needs, decided once."""

from __future__ import annotations


def pad_id(tokenizer) -> int:
    """The id used to pad batches: the tokenizer's pad token, else its EOS token, else 0 (never None)."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if candidate is not None:
            return int(candidate)
    return 0


def bos_id(tokenizer) -> int | None:
    """The BOS id this tokenizer puts first when it encodes text with its special tokens (Llama, Gemma), else None
    (GPT-2 style tokenizers add nothing): perplexity windows and calibration windows start with it, as the model
    saw text in training and as transformers' own evaluation does."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    try:
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode a plain letter adds nothing we can see
        return None
    return int(bos) if ids and ids[0] == bos else None
