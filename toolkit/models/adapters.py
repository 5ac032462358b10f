"""Architecture adapters as data: where the blocks, attention/MLP linears, norms, embeddings and head live.

Every technique that walks a transformer asks `adapter_for(model)` instead of hard-coding module names.
Paths are relative to the model (block-level paths are relative to one block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from toolkit.core.errors import BadInputError


@dataclass(frozen=True)
class ArchAdapter:
    model_types: tuple[str, ...]
    layers: tuple[str, ...]  # candidate paths to the ModuleList of blocks (first that exists wins)
    attn_q: str | None
    attn_k: str | None
    attn_v: str | None
    attn_qkv_fused: str | None  # GPT-2 c_attn, NeoX query_key_value
    attn_out: str
    mlp_gate: str | None
    mlp_up: str
    mlp_down: str
    norm_attn: str  # the norm before attention (pre-LN) or after it (post-LN, BERT)
    norm_mlp: str
    final_norm: tuple[str, ...]
    embed_tokens: tuple[str, ...]
    embed_positions: tuple[str, ...] = ()
    lm_head: str | None = "lm_head"
    norm_kind: str = "layernorm"  # layernorm | rmsnorm
    conv1d: bool = False  # GPT-2 stores linears as Conv1D with (in, out) weights
    causal: bool = True
    extra_norms: tuple[str, ...] = ()  # Gemma3's pre/post feed-forward norms

    def attention_inputs(self) -> list[str]:
        return [self.attn_qkv_fused] if self.attn_qkv_fused else [self.attn_q, self.attn_k, self.attn_v]

    def mlp_inputs(self) -> list[str]:
        return [p for p in (self.mlp_gate, self.mlp_up) if p]

    def sequential_groups(self) -> list[list[str]]:
        """Linears grouped in the order their inputs become available inside a block: [qkv] -> [o] -> [in] -> [out]."""
        return [self.attention_inputs(), [self.attn_out], self.mlp_inputs(), [self.mlp_down]]

    def block_linears(self) -> list[str]:
        return [p for group in self.sequential_groups() for p in group]


GPT2 = ArchAdapter(
    model_types=("gpt2",), layers=("transformer.h",), attn_q=None, attn_k=None, attn_v=None,
    attn_qkv_fused="attn.c_attn", attn_out="attn.c_proj", mlp_gate=None, mlp_up="mlp.c_fc", mlp_down="mlp.c_proj",
    norm_attn="ln_1", norm_mlp="ln_2", final_norm=("transformer.ln_f",), embed_tokens=("transformer.wte",),
    embed_positions=("transformer.wpe",), conv1d=True,
)
LLAMA = ArchAdapter(
    model_types=("llama", "mistral", "qwen2", "qwen3"), layers=("model.layers",),
    attn_q="self_attn.q_proj", attn_k="self_attn.k_proj", attn_v="self_attn.v_proj", attn_qkv_fused=None,
    attn_out="self_attn.o_proj", mlp_gate="mlp.gate_proj", mlp_up="mlp.up_proj", mlp_down="mlp.down_proj",
    norm_attn="input_layernorm", norm_mlp="post_attention_layernorm", final_norm=("model.norm",),
    embed_tokens=("model.embed_tokens",), norm_kind="rmsnorm",
)
GEMMA3 = ArchAdapter(
    model_types=("gemma3_text", "gemma3"), layers=("model.layers", "model.language_model.layers"),
    attn_q="self_attn.q_proj", attn_k="self_attn.k_proj", attn_v="self_attn.v_proj", attn_qkv_fused=None,
    attn_out="self_attn.o_proj", mlp_gate="mlp.gate_proj", mlp_up="mlp.up_proj", mlp_down="mlp.down_proj",
    norm_attn="input_layernorm", norm_mlp="pre_feedforward_layernorm",
    final_norm=("model.norm", "model.language_model.norm"),
    embed_tokens=("model.embed_tokens", "model.language_model.embed_tokens"), norm_kind="rmsnorm",
    extra_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
)
OPT = ArchAdapter(
    model_types=("opt",), layers=("model.decoder.layers",), attn_q="self_attn.q_proj", attn_k="self_attn.k_proj",
    attn_v="self_attn.v_proj", attn_qkv_fused=None, attn_out="self_attn.out_proj", mlp_gate=None, mlp_up="fc1",
    mlp_down="fc2", norm_attn="self_attn_layer_norm", norm_mlp="final_layer_norm",
    final_norm=("model.decoder.final_layer_norm",), embed_tokens=("model.decoder.embed_tokens",),
    embed_positions=("model.decoder.embed_positions",),
)
GPT_NEOX = ArchAdapter(
    model_types=("gpt_neox",), layers=("gpt_neox.layers",), attn_q=None, attn_k=None, attn_v=None,
    attn_qkv_fused="attention.query_key_value", attn_out="attention.dense", mlp_gate=None,
    mlp_up="mlp.dense_h_to_4h", mlp_down="mlp.dense_4h_to_h", norm_attn="input_layernorm",
    norm_mlp="post_attention_layernorm", final_norm=("gpt_neox.final_layer_norm",),
    embed_tokens=("gpt_neox.embed_in",),
)
BERT = ArchAdapter(
    model_types=("bert",), layers=("bert.encoder.layer", "encoder.layer"), attn_q="attention.self.query",
    attn_k="attention.self.key", attn_v="attention.self.value", attn_qkv_fused=None,
    attn_out="attention.output.dense", mlp_gate=None, mlp_up="intermediate.dense", mlp_down="output.dense",
    norm_attn="attention.output.LayerNorm", norm_mlp="output.LayerNorm", final_norm=(),
    embed_tokens=("bert.embeddings.word_embeddings", "embeddings.word_embeddings"),
    embed_positions=("bert.embeddings.position_embeddings", "embeddings.position_embeddings"),
    lm_head=None, causal=False,
)
ADAPTERS = (GPT2, LLAMA, GEMMA3, OPT, GPT_NEOX, BERT)


def adapter_for(model: nn.Module) -> ArchAdapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    known = ", ".join(t for a in ADAPTERS for t in a.model_types)
    raise BadInputError(f"no architecture adapter for model_type '{model_type}'", f"supported: {known}")


def get_module(root: nn.Module, path: str) -> nn.Module:
    module = root
    for part in path.split("."):
        if not hasattr(module, part):
            raise AttributeError(path)
        module = getattr(module, part)
    return module


def first_module(root: nn.Module, paths: tuple[str, ...]) -> nn.Module | None:
    for path in paths:
        try:
            return get_module(root, path)
        except AttributeError:
            continue
    return None


def layers_path(model: nn.Module, adapter: ArchAdapter | None = None) -> str:
    """The path of the block list that exists in this model (Gemma3ForConditionalGeneration keeps it under
    model.language_model, the text model under model): the one place that resolves `adapter.layers`."""
    adapter = adapter or adapter_for(model)
    for path in adapter.layers:
        try:
            get_module(model, path)
        except AttributeError:
            continue
        return path
    raise BadInputError(f"model has none of the block lists {adapter.layers}")


def get_layers(model: nn.Module, adapter: ArchAdapter | None = None) -> nn.ModuleList:
    return get_module(model, layers_path(model, adapter))


class ModelView:
    """An adapter bound to one model: the resolved block list and full paths of every block linear, and linear
    weights read/written as (out, in) whatever the storage (GPT-2's Conv1D is handled here, nowhere else)."""

    def __init__(self, model: nn.Module, adapter: ArchAdapter | None = None) -> None:
        self.model = model
        self.adapter = adapter or adapter_for(model)
        self.layers_path = layers_path(model, self.adapter)
        self.conv1d = self.adapter.conv1d

    @property
    def blocks(self) -> nn.ModuleList:
        return get_module(self.model, self.layers_path)

    def __len__(self) -> int:
        return len(self.blocks)

    def block_path(self, index: int) -> str:
        return f"{self.layers_path}.{index}"

    def linear_path(self, index: int, linear: str) -> str:
        return f"{self.layers_path}.{index}.{linear}"

    def block_linear_paths(self) -> list[str]:
        """Full paths of every block linear, block by block in sequential-group order."""
        return [self.linear_path(i, p) for i in range(len(self)) for p in self.adapter.block_linears()]

    def module(self, path: str) -> nn.Module:
        return get_module(self.model, path)

    def weight(self, path: str):
        return linear_weight(self.module(path), self.conv1d)

    def set_weight(self, path: str, weight) -> None:
        set_linear_weight(self.module(path), weight, self.conv1d)

    def attention(self, index: int) -> nn.Module:
        return get_module(self.blocks[index], self.adapter.attn_out.rsplit(".", 1)[0])

    @property
    def embed_tokens(self) -> nn.Module | None:
        return first_module(self.model, self.adapter.embed_tokens)

    @property
    def final_norm(self) -> nn.Module | None:
        return first_module(self.model, self.adapter.final_norm)

    @property
    def lm_head(self) -> nn.Module | None:
        return get_lm_head(self.model, self.adapter)


def get_lm_head(model: nn.Module, adapter: ArchAdapter | None = None) -> nn.Module | None:
    """The output head (older GPT-NeoX releases call it embed_out)."""
    adapter = adapter or adapter_for(model)
    return first_module(model, (adapter.lm_head, "embed_out")) if adapter.lm_head else None


def linear_weight(module: nn.Module, conv1d: bool):
    """The weight as (out_features, in_features), a view for nn.Linear and a transposed copy for Conv1D."""
    return module.weight.data.t() if conv1d else module.weight.data


def set_linear_weight(module: nn.Module, weight, conv1d: bool) -> None:
    module.weight.data.copy_(weight.t() if conv1d else weight)


def cache_kwarg(model: nn.Module) -> str:
    """The forward's KV-cache argument: transformers 5.x names it `cache` (and ignores `past_key_values`), 4.x
    `past_key_values`; the model output carries it under the same name."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the forward takes `logits_to_keep` (the LM head on the last positions only)."""
    import inspect

    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
