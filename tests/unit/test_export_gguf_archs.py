"""GGUF export of every architecture llama.cpp serves, on the tiny models of toolkit.models.tiny (no llama.cpp here:
examples/gguf/agreement.py runs llama.cpp itself). Per architecture the file reads back with gguf.GGUFReader and:
- every quantized slot is a Q4_0 tensor whose rows of codes are the grid's and whose weights equal the grid weights
  within the fp16 scale rounding (scripts/arch_matrix.gguf_grid_check);
- every tensor name is one llama.cpp's architecture declares (gguf.MODEL_TENSORS), tied heads are not written;
- the metadata keys llama.cpp's loader for the architecture requires are there (read from its
  src/models/<arch>.cpp: the norm epsilon, Granite's logit scale, GPT-NeoX's parallel-residual flag, ...);
- a (1 + w) norm (Gemma) is written as 1 + w, any other as w;
- where transformers' own GGUF loader knows the architecture, it reloads the file to the in-memory model's logits
  (with the fp16-rounded scales): it undoes llama.cpp's q/k permutation and q/k/v grouping independently of us.
Refusals: config conventions llama.cpp hard-codes, checked before loading, one line each."""

from pathlib import Path

import numpy as np
import pytest
import torch
from testkit import load_script

from toolkit.core.errors import BadInputError
from toolkit.export.gguf import LAYOUTS, check_architecture, read_q4_0, save_gguf
from toolkit.export.quantized import from_model
from toolkit.models.archs import traits
from toolkit.models.tiny import build_tiny, tiny_config
from toolkit.models.view import view_of

MATRIX = load_script(Path(__file__).resolve().parents[2] / "scripts" / "arch_matrix.py", "arch_matrix")
pytestmark = pytest.mark.usefixtures("one_thread")

RMS = {"llama", "smollm3", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "olmoe", "phi3", "gemma", "gemma2", "gemma3",
       "olmo2", "granite", "exaone4"}
REQUIRED = {"granite": ["logit_scale"], "gptneox": ["use_parallel_residual"], "command-r": ["logit_scale"],
            "gemma2": ["attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"]}
TRANSFORMERS_RELOADS = ("llama", "qwen2", "phi3", "bloom", "stablelm", "starcoder2")  # its GGUF loader maps them


def _quantized(arch: str, tokenizer, prune: bool = True):
    """The tiny model with every slot RTN-quantized per channel (half of each row pruned): (model, QuantizedModel)."""
    from toolkit.compress.quant import fit_weight_scale, quantize_rows

    torch.manual_seed(0)
    model = build_tiny(arch, len(tokenizer))
    view = view_of(model)
    scales = {}
    for i, block in enumerate(view.blocks):
        for slot in view.slots(i):
            weight = slot.weight(block)
            if prune:
                weight = weight * (weight.abs() > weight.abs().quantile(0.5, dim=1, keepdim=True))
            name = view.full_name(i, slot)
            scales[name] = fit_weight_scale(weight, 4)
            slot.set_weight(block, quantize_rows(weight, scales[name], 4))
    metadata = {"method": "rtn", "w_bits": 4, "a_bits": 16, "kv_bits": 16, "sparsity": 0.5}
    return model, from_model(view, tokenizer, scales, 4, metadata, {"source_model": arch})


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_tokenizer):
    cache = {}

    def get(arch):
        if arch not in cache:
            out = tmp_path_factory.mktemp(arch)
            model, q = _quantized(arch, tiny_tokenizer)
            summary = save_gguf(q, out, card={"command": "pytest"})
            cache[arch] = (model, q, out / summary["file"], summary)
        return cache[arch]
    return get


@pytest.mark.parametrize("arch", MATRIX.GGUF_ARCHS)
def test_every_served_architecture_reads_back(arch, exported):
    import gguf

    model, q, path, summary = exported(arch)
    name = traits(arch).gguf_arch
    metadata, grids, floats = read_q4_0(path)
    assert metadata["general.architecture"] == name == summary["architecture"]
    ok, detail, _ = MATRIX.gguf_grid_check(path, q)
    assert ok, detail
    layers = len(q.view)
    model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[name]
    allowed = {gguf.TENSOR_NAMES[t].format(bid=b) + suffix for t in gguf.MODEL_TENSORS[model_arch]
               for b in range(layers) for suffix in (".weight", ".bias")}
    assert set(grids) | set(floats) <= allowed
    text = getattr(model.config, "text_config", None) or model.config
    embed = model.get_input_embeddings().weight
    assert floats.get("token_embd.weight", np.zeros(0)).shape == tuple(embed.shape)
    assert ("output.weight" in floats) != (model.get_output_embeddings().weight is embed)  # a tied head: not written
    eps = "attention.layer_norm_rms_epsilon" if name in RMS else "attention.layer_norm_epsilon"
    for key in ["context_length", "embedding_length", "block_count", eps, *REQUIRED.get(name, [])]:
        assert f"{name}.{key}" in metadata, key
    assert metadata[f"{name}.block_count"] == layers and metadata[f"{name}.embedding_length"] == text.hidden_size
    if q.view.dims()["experts"]:
        assert metadata[f"{name}.expert_count"] == q.view.dims()["experts"]
        assert metadata[f"{name}.expert_used_count"] == text.num_experts_per_tok
        assert {f"blk.0.ffn_{k}_exps.weight" for k in ("gate", "up", "down")} <= set(grids)
    final = q.view.final_norm
    offset = 1.0 if name.startswith("gemma") else 0.0  # Gemma's RMSNorm scales by (1 + w); llama.cpp's by w
    assert np.allclose(floats["output_norm.weight"], final.weight.detach().numpy() + offset, rtol=0, atol=1e-7)
    assert tokenizer_round_trip(metadata, q.tokenizer)


def tokenizer_round_trip(metadata: dict, tokenizer) -> bool:
    tokens = metadata["tokenizer.ggml.tokens"]
    return all(tokens[i] == t for t, i in tokenizer.get_vocab().items()) and \
        metadata["tokenizer.ggml.model"] == "gpt2"


@pytest.mark.parametrize("arch", TRANSFORMERS_RELOADS)
def test_transformers_gguf_loader_reproduces_the_logits(arch, exported):
    """transformers undoes llama.cpp's conventions (q/k permutation, BLOOM's per-head q/k/v, ...) by its own code:
    its reload computes the in-memory model with the file's fp16-rounded scales."""
    from transformers import AutoModelForCausalLM

    model, q, path, _ = exported(arch)
    with torch.no_grad():
        for name, grid in q.linears.items():
            q.view.set_weight(name, grid.codes.float() * grid.scales.half().float())
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.randint(3, 290, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = model(ids).logits, loaded(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5


def test_gemma_attention_scale_is_folded_into_q(exported):
    """llama.cpp scales Gemma's attention by 1/sqrt(head_dim), transformers by query_pre_attn_scalar^-1/2 (256 on the
    tiny models, head_dim 16): the ratio 1/4 multiplies Gemma 2's q rows (its Q4_0 scales) and Gemma 3's q-norm."""
    _, q, path, summary = exported("gemma3_text")
    _, _, floats = read_q4_0(path)
    norm = q.view.blocks[0].self_attn.q_norm.weight.detach().numpy()
    assert np.allclose(floats["blk.0.attn_q_norm.weight"], (1.0 + norm) * 0.25, atol=1e-7)
    assert np.allclose(floats["blk.0.attn_k_norm.weight"], 1.0 + q.view.blocks[0].self_attn.k_norm.weight.detach().numpy())
    assert any("0.25" in note for note in summary["notes"])
    _, q2, path2, _ = exported("gemma2")
    _, grids, _ = read_q4_0(path2)
    grid = q2.linears["model.layers.0.self_attn.q_proj"]
    d = grids["blk.0.attn_q.weight"][1]
    assert np.array_equal(np.sort(d[:, 0]), np.sort((grid.scales[:, 0].numpy() * 0.25).astype(np.float16)))


@pytest.mark.parametrize("arch, fragment", [("opt", "no loader for opt"), ("gptj", "no loader or graph"),
                                            ("bert", "an encoder")])
def test_architectures_llama_cpp_cannot_serve_are_refused_by_type(arch, fragment):
    with pytest.raises(BadInputError, match=fragment):
        check_architecture(arch)


def _config(arch, **overrides):
    config = tiny_config(arch, 300)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


@pytest.mark.parametrize("arch, overrides, fragment", [
    ("qwen3_moe", {"norm_topk_prob": False}, "always renormalises"),
    ("qwen2_moe", {"norm_topk_prob": True}, "never renormalises"),
    ("qwen2_moe", {"mlp_only_layers": [1]}, "dense MLP"),
    ("olmoe", {"num_key_value_heads": 2}, "full hidden width"),
    ("smollm3", {"no_rope_layers": [1, 0, 1, 0]}, "every fourth layer"),
    ("exaone4", {"layer_types": ["sliding_attention", "full_attention"]}, "only for 64-layer"),
    ("falcon", {"alibi": True}, "ALiBi"),
    ("falcon", {"parallel_attn": False}, "in parallel"),
    ("phi", {"qk_layernorm": True}, "q/k LayerNorms"),
    ("cohere", {"use_qk_norm": True}, "q/k norms"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                   "original_max_position_embeddings": 32}}, "RoPE type 'yarn'"),
    ("gemma3_text", {"attn_logit_softcapping": 50.0}, "soft-capping"),
])
def test_conventions_llama_cpp_hard_codes_are_checked_from_the_config(arch, overrides, fragment):
    config = _config(arch, **overrides)
    with pytest.raises(BadInputError, match=fragment):
        check_architecture(config)
    base = {"qwen3_moe": {"norm_topk_prob": True},  # as real Qwen3-MoE checkpoints (they renormalise)
            "olmoe": {"num_key_value_heads": 4}}.get(arch, {})  # as OLMoE-1B-7B (no grouped-query attention)
    check_architecture(_config(arch, **base))  # the config without the change passes


def test_real_model_conventions_pass():
    """Qwen3-MoE checkpoints renormalise the top-k weights (norm_topk_prob=true): served as llama.cpp's qwen3moe."""
    assert check_architecture(_config("qwen3_moe", norm_topk_prob=True)) == "qwen3moe"


def test_llama3_rope_is_written_as_rope_factors(tmp_path, tiny_tokenizer):
    """Llama-3 RoPE scaling: llama.cpp divides each frequency by rope_freqs; the factors are transformers' default
    inverse frequencies over its llama3-scaled ones."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from toolkit.export.gguf.metadata import rope_factors

    config = _config("llama", head_dim=16)
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    check_architecture(config)
    factors = rope_factors(config, 16)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    default = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    assert np.allclose(default / factors, scaled.numpy(), rtol=1e-6)
    assert factors.min() == pytest.approx(1.0) and factors.max() == pytest.approx(8.0)


def test_every_layout_is_a_llama_cpp_architecture():
    import gguf

    assert set(LAYOUTS) <= set(gguf.MODEL_ARCH_NAMES.values())
    for model_type in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "olmoe", "phi3", "phi", "gemma",
                       "gemma2", "gemma3_text", "gemma3", "olmo2", "granite", "cohere", "starcoder2", "stablelm",
                       "smollm3", "exaone4", "falcon", "gpt_neox", "gpt2", "bloom"):
        assert traits(model_type).gguf_arch in LAYOUTS, model_type


QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")


@pytest.mark.parametrize("pre, name", [
    ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, "gpt-2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                             {"type": "ByteLevel", "use_regex": True}]}, "smollm"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}},
                                             {"type": "ByteLevel", "use_regex": False}]}, "qwen2"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": QWEN2_SPLIT.replace(
        r"\p{N}|", r"\p{N}{1,3}|")}}, {"type": "ByteLevel", "use_regex": False}]}, "llama-bpe"),
])
def test_byte_level_pre_tokenizers_map_to_llama_cpp_names(pre, name):
    from toolkit.export.gguf.vocab import bpe_pre

    assert bpe_pre(pre) == name


def test_an_unknown_pre_tokenizer_regex_is_refused():
    from toolkit.export.gguf.vocab import bpe_pre

    with pytest.raises(BadInputError, match="llama.cpp would split text differently"):
        bpe_pre({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": r"\w+"}},
                                                         {"type": "ByteLevel", "use_regex": False}]})


def test_sentencepiece_style_vocabulary_is_written_with_merge_rank_scores(tmp_path):
    """A BPE over '▁' with byte fallback (Gemma, Llama 2) is llama.cpp's 'llama' tokenizer: the token each merge
    produces scores −rank (llama.cpp merges the highest-scoring pair first, as BPE merges the lowest rank), byte
    tokens <0xXX> are typed BYTE, added special tokens CONTROL, the unknown token UNKNOWN."""
    import gguf
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    from toolkit.export.gguf.vocab import write_tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "▁": 4, "a": 5, "b": 6, "ab": 7, "▁ab": 8, "ba": 9}
    merges = [("a", "b"), ("▁", "ab"), ("b", "a")]
    backend = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    path = tmp_path / "v.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    write_tokenizer(writer, tokenizer, len(vocab))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    metadata, _, _ = read_q4_0(path)
    assert metadata["tokenizer.ggml.model"] == "llama" and metadata["tokenizer.ggml.add_space_prefix"] is False
    scores = dict(zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.scores"]))
    assert scores["ab"] == 0 and scores["▁ab"] == -1 and scores["ba"] == -2 and scores["a"] == 0
    types = dict(zip(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]))
    assert types["<0x41>"] == gguf.TokenType.BYTE and types["<s>"] == gguf.TokenType.CONTROL
    assert types["<unk>"] == gguf.TokenType.UNKNOWN and types["ab"] == gguf.TokenType.NORMAL
