"""The vocabulary as llama.cpp tokenizes it: byte-level BPE as tokenizer model "gpt2" (its pre-tokenizer by llama.cpp's
name for it), SentencePiece-style BPE as "llama" (scores ordering merges as the BPE merge ranks do)."""

from __future__ import annotations

import json

from toolkit.core.errors import BadInputError


def _tokenizer_kind(spec: dict) -> str:
    """"bpe" (byte-level BPE: GPT-2, Llama 3, Qwen, SmolLM), "spm" (SentencePiece-style BPE over '▁' with byte
    fallback: Llama 2, Gemma), or one BadInputError line."""
    model = spec.get("model", {})
    text = json.dumps({k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")}, ensure_ascii=False)
    if model.get("type") != "BPE":
        raise BadInputError(f"GGUF export writes BPE vocabularies (byte-level or SentencePiece-style); this tokenizer "
                            f"is {model.get('type')}", "use the packed or compressed-tensors export")
    if '"ByteLevel"' in text:
        return "bpe"
    if model.get("byte_fallback") and "▁" in text:
        return "spm"
    raise BadInputError("GGUF export writes byte-level BPE or SentencePiece-style ('▁', byte-fallback) vocabularies; "
                        "this BPE tokenizer is neither", "use the packed or compressed-tensors export")


# byte-level BPE pre-tokenisation → the name llama.cpp gives its regex (llama.cpp splits text by name, not by regex);
# the Split regexes as tokenizer.json files hold them (llama.cpp's src/llama-vocab.cpp quotes them)
BPE_PRE_SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",  # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",  # Qwen 2/2.5/3
}


def bpe_pre(pre: dict) -> str:
    """llama.cpp's pre-tokenizer name for a byte-level BPE tokenizer's pre_tokenizer, or one BadInputError line."""
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    splits = [p.get("pattern", {}).get("Regex") for p in parts if p.get("type") == "Split"]
    byte_level = next((p for p in parts if p.get("type") == "ByteLevel"), {})
    digits = any(p.get("type") == "Digits" and p.get("individual_digits") for p in parts)
    if kinds == ["ByteLevel"] and byte_level.get("use_regex", True):
        return "gpt-2"  # GPT-2's own regex
    if set(kinds) == {"Digits", "ByteLevel"} and digits and byte_level.get("use_regex", True):
        return "smollm"  # SmolLM / StarCoder: digits one by one, then GPT-2's regex
    if len(splits) == 1 and kinds == ["Split", "ByteLevel"] and splits[0] in BPE_PRE_SPLITS \
            and not byte_level.get("use_regex", True):
        return BPE_PRE_SPLITS[splits[0]]
    raise BadInputError(f"GGUF export: the tokenizer's pre-tokenizer ({', '.join(str(k) for k in kinds)}"
                        f"{f', regex {splits[0]!r}' if splits else ''}) is not one this writer maps to llama.cpp's "
                        "named pre-tokenizers (gpt-2, smollm, llama-bpe, qwen2); llama.cpp would split text "
                        "differently", "use the packed or compressed-tensors export")


def write_tokenizer(writer, tokenizer, vocab_size: int) -> None:
    """The vocabulary as llama.cpp tokenizes it: byte-level BPE as tokenizer model "gpt2" (tokens, types, merges,
    the pre-tokenizer by name), SentencePiece-style BPE as "llama" (tokens, types, and scores that order merges as
    the BPE merge ranks do: the token a merge of rank r produces scores −r; byte tokens <0xXX> typed BYTE)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise BadInputError("GGUF export needs a fast (tokenizers) BPE tokenizer")
    spec = json.loads(backend.to_str())
    if _tokenizer_kind(spec) == "bpe":
        _write_bpe(writer, spec, vocab_size)
    else:
        _write_spm(writer, spec, vocab_size)
    _write_special_ids(writer, tokenizer)


def _vocabulary(spec: dict, vocab_size: int) -> tuple[dict[str, int], dict[int, bool], list[str], list[int]]:
    """(token → id, added tokens included; added id → special or not; the token list over max(vocab_size, ids)
    rows, unused ones [PADi]; their types, NORMAL or UNUSED)."""
    import gguf

    vocab = dict(spec["model"]["vocab"])
    special = {}
    for added in spec.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        special[added["id"]] = bool(added.get("special"))
    size = max(vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [int(gguf.TokenType.UNUSED)] * size
    for text, index in vocab.items():
        tokens[index] = text
        types[index] = int(gguf.TokenType.NORMAL)
    return vocab, special, tokens, types


def _mark_added(types: list[int], special: dict[int, bool]) -> None:
    import gguf

    for index, is_special in special.items():
        types[index] = int(gguf.TokenType.CONTROL if is_special else gguf.TokenType.USER_DEFINED)


def _write_bpe(writer, spec: dict, vocab_size: int) -> None:
    _, special, tokens, types = _vocabulary(spec, vocab_size)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    _mark_added(types, special)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(bpe_pre(spec.get("pre_tokenizer") or {}))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)


def _merge_rank_scores(model: dict, vocab: dict[str, int], types: list[int]) -> list[float]:
    """The token a merge of rank r produces scores −r, single characters 0, other tokens −1e9; byte tokens <0xXX>
    score 0 and are typed BYTE (in `types`)."""
    import gguf

    produced: dict[str, float] = {}
    for rank, merge in enumerate(model.get("merges", [])):
        a, b = merge if not isinstance(merge, str) else merge.split(" ", 1)
        produced.setdefault(a + b, -float(rank))
    scores = [-1e9] * len(types)  # a multi-character token no merge produces is never a merge result
    for text, index in vocab.items():
        scores[index] = produced.get(text, 0.0 if len(text) == 1 else -1e9)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            types[index], scores[index] = int(gguf.TokenType.BYTE), 0.0
    return scores


def _write_spm(writer, spec: dict, vocab_size: int) -> None:
    import gguf

    model = spec["model"]
    vocab, special, tokens, types = _vocabulary(spec, vocab_size)
    scores = _merge_rank_scores(model, vocab, types)
    _mark_added(types, special)
    if model.get("unk_token") in vocab:
        types[vocab[model["unk_token"]]] = int(gguf.TokenType.UNKNOWN)
    rules = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")], ensure_ascii=False)
    prefix = '"Prepend"' in rules or ('"Metaspace"' in rules and '"prepend_scheme": "never"' not in rules
                                      and '"add_prefix_space": false' not in rules)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(prefix)


def _write_special_ids(writer, tokenizer) -> None:
    """BOS/EOS/UNK/PAD ids, whether llama.cpp adds BOS (as the tokenizer encodes text) and EOS (never), the chat
    template."""
    from toolkit.models.tokens import bos_id

    for name, value in (("bos", tokenizer.bos_token_id), ("eos", tokenizer.eos_token_id),
                        ("unk", tokenizer.unk_token_id), ("pad", tokenizer.pad_token_id)):
        if value is not None:
            getattr(writer, f"add_{name}_token_id")(int(value))
    writer.add_add_bos_token(bos_id(tokenizer) is not None)  # as the tokenizer encodes text (BOS first or not)
    writer.add_add_eos_token(False)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        writer.add_chat_template(template)
