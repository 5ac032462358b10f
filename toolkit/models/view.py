"""ModelView: what every technique needs to know about a model's architecture, discovered from the model itself
(each kind of block's structure: toolkit.models.layout).

Discovery first, tables for the exceptions (`toolkit.models.archs`):
- the decoder blocks: the `ModuleList` whose items' class is in the model's `_no_split_modules` (inside multimodal
  wrappers too: the one that belongs to the text decoder), else the longest list of identical blocks with linears;
- every compressible weight of a block (`Slot`): `nn.Linear`, GPT-2's `Conv1D`, and each expert of a fused 3-D expert
  tensor (transformers 5 `*Experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I]); routers are kept apart;
- the order in which the slots' inputs appear inside a block and which slots share an input (the sequential
  groups), by running one block on a probe input with hooks; the norm whose output each group reads, each norm's
  kind (LayerNorm / RMSNorm, a (1 + w) scale) measured numerically; post-norms and q/k norms by where they sit;
- embeddings and head (`get_input_embeddings` / `get_output_embeddings`, tied or not) and the final norm.

The view is bound once per run and handed down; every consumer asks it instead of re-deriving module paths.
Weights are read and written as (out, in) whatever the storage (Conv1D's transposition, one expert's slice).
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError
from toolkit.models import archs
from toolkit.models.layout import (
    BlockLayout,
    Slot,
    _attention_path,
    _is_conv1d,
    discover_layout,
    is_norm,
    signature,
    structural_slots,
)

log = logging.getLogger("iclrkit")

def find_blocks(model: nn.Module) -> str:
    """The path of the decoder's block list."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    candidates = [(n, m) for n, m in lists if type(m[0]).__name__ in names
                  and all(type(x) is type(m[0]) for x in m)]
    if not candidates:  # no declaration: the longest list of identical modules holding linears
        candidates = [(n, m) for n, m in lists if all(type(x) is type(m[0]) for x in m)
                      and any(isinstance(s, nn.Linear) or _is_conv1d(s) for s in m[0].modules())]
    if not candidates:
        raise BadInputError(f"{type(model).__name__}: no decoder block list found (no ModuleList of blocks in "
                            f"_no_split_modules {sorted(names) or '(none declared)'}, nor any list of identical "
                            f"blocks holding linear layers)")
    if len(candidates) > 1:  # multimodal wrappers: prefer the text decoder (the list beside the input embeddings)
        embed = _safe(lambda: model.get_input_embeddings())
        owner = next((n for n, m in model.named_modules() if embed is not None and any(c is embed for c in m.children())),
                     None)
        if owner is not None:
            near = [(n, m) for n, m in candidates if n.startswith(owner + ".") or (owner == "" and "." not in n)]
            candidates = near or candidates
        candidates.sort(key=lambda item: -len(item[1]))
    return candidates[0][0]


def _safe(fn):
    try:
        return fn()
    except (AttributeError, NotImplementedError, TypeError):
        return None


# -- the probe: one block run with hooks -----------------------------------------------------------------------------

def probe_ids(model: nn.Module, length: int = 8) -> torch.Tensor:
    embed = model.get_input_embeddings()
    vocab = embed.num_embeddings if hasattr(embed, "num_embeddings") else embed.weight.shape[0]
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, max(2, min(vocab, 64)), (1, length), generator=generator)


def capture_block_call(model: nn.Module, blocks: nn.ModuleList, index: int, ids: torch.Tensor):
    """(hidden, args, kwargs) the model passes block `index` for `ids` (the forward stops there)."""
    from toolkit.nn.hooks import StopForward

    captured = {}

    def catcher(module, args, kwargs):
        captured["hidden"] = args[0] if args else kwargs.pop("hidden_states")
        captured["args"] = tuple(None if type(a).__name__.endswith("Cache") else a for a in args[1:])
        captured["kwargs"] = {k: (None if type(v).__name__.endswith("Cache") else v) for k, v in kwargs.items()
                              if k != "hidden_states"}
        raise StopForward

    device = next(blocks[index].parameters()).device
    handle = blocks[index].register_forward_pre_hook(catcher, with_kwargs=True)
    try:
        with torch.no_grad():
            if device.type == "meta":  # transformers' packed-sequence check reads a value without a cache
                model(ids.to(device))
            else:
                model(ids.to(device), use_cache=False)
    except StopForward:
        pass
    finally:
        handle.remove()
    if not captured:
        raise BadInputError(f"{type(model).__name__}: a probe forward never reached block {index}")
    kwargs = dict(captured["kwargs"])
    kwargs["use_cache"] = False
    return captured["hidden"], captured["args"], kwargs


# -- the view --------------------------------------------------------------------------------------------------------

class ModelView:
    """The architecture of one model, resolved once: its blocks, each block's slots and groups (by probing), norms,
    embeddings, head and the per-architecture exceptions that discovery cannot give."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = getattr(model, "config", None)
        self.model_type = getattr(self.config, "model_type", None) or type(model).__name__
        self.traits = archs.traits(self.model_type)
        self.layers_path = find_blocks(model)
        self._layouts: dict[tuple, BlockLayout] = {}
        slots, _, experts = structural_slots(self.blocks[0])
        if not slots:
            raise BadInputError(f"{self.model_type}: block {self.layers_path}.0 holds no linear layers or fused "
                                f"experts to work on")
        if experts is not None:
            count = self.blocks[0].get_submodule(experts).gate_up_proj.shape[0]
            config = getattr(self.config, "text_config", None) or self.config
            top_k = getattr(config, "num_experts_per_tok", None)
            if top_k is not None and not 0 < top_k <= count:
                raise BadInputError(f"{self.model_type}: the router picks num_experts_per_tok={top_k} of {count} "
                                    "experts", "num_experts_per_tok must be between 1 and the number of experts")

    # -- blocks
    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.get_submodule(self.layers_path)

    def __len__(self) -> int:
        return len(self.blocks)

    def block_path(self, index: int) -> str:
        return f"{self.layers_path}.{index}"

    @property
    def decoder(self) -> nn.Module:
        parent = self.layers_path.rsplit(".", 1)[0] if "." in self.layers_path else ""
        return self.model.get_submodule(parent) if parent else self.model

    # -- layouts
    def layout(self, index: int = 0, block_call=None) -> BlockLayout:
        """Block `index`'s layout, probed once per kind of block. Eager models are probed with a short forward;
        a caller that already holds the block's input (the onloaded pipeline) passes `block_call` =
        (hidden, args, kwargs)."""
        block = self.blocks[index]
        key = signature(block)
        if key not in self._layouts:
            if block_call is None:  # (a meta-device model probes on meta tensors: groups by tensor identity only)
                block_call = capture_block_call(self.model, self.blocks, index, probe_ids(self.model))
            hidden, args, kwargs = block_call
            self._layouts[key] = discover_layout(block, args, kwargs, hidden)
            self._check_layout(self._layouts[key], index)
        return self._layouts[key]

    def known_layout(self, index: int) -> BlockLayout | None:
        return self._layouts.get(signature(self.blocks[index]))

    def _check_layout(self, layout: BlockLayout, index: int) -> None:
        if not layout.groups:
            raise BadInputError(f"{self.model_type}: no linear layer of block {index} was reached by a forward")
        if layout.experts is not None:
            from toolkit.models.experts import check_experts

            check_experts(self.blocks[index].get_submodule(layout.experts), self.model_type)

    # -- slots by full name ("model.layers.3.self_attn.q_proj", "model.layers.0.mlp.experts.down_proj.5")
    def slots(self, index: int = 0) -> list[Slot]:
        """Block `index`'s slots in group order (needs the layout); `structural_slots` when only shapes matter."""
        return self.layout(index).slots

    def full_name(self, index: int, slot: Slot | str) -> str:
        return f"{self.layers_path}.{index}.{slot if isinstance(slot, str) else slot.name}"

    def slot_names(self) -> list[str]:
        """Full names of every block slot, block by block in group order."""
        return [self.full_name(i, s) for i in range(len(self)) for s in self.slots(i)]

    def resolve(self, name: str) -> tuple[nn.Module, Slot]:
        """(block, slot) for a full slot name."""
        prefix = self.layers_path + "."
        if not name.startswith(prefix):
            raise KeyError(name)
        index, rest = name[len(prefix):].split(".", 1)
        block = self.blocks[int(index)]
        slots, routers, _ = structural_slots(block)
        for slot in slots + routers:
            if slot.name == rest:
                return block, slot
        raise KeyError(name)

    def weight(self, name: str) -> torch.Tensor:
        block, slot = self.resolve(name)
        return slot.weight(block)

    def param_name(self, name: str) -> str:
        """The state-dict name of the parameter a slot lives in (a fused expert tensor holds all its experts)."""
        _, slot = self.resolve(name)
        index = name[len(self.layers_path) + 1:].split(".", 1)[0]
        return f"{self.layers_path}.{index}.{slot.module}.{slot.param}"

    def quantized_inputs(self) -> list[str]:
        """Full paths of the modules whose input a run with activation quantization fake-quantizes: every Linear /
        Conv1D slot (fused experts compute their inputs inside one forward: compress refuses a_bits < 16 on
        them)."""
        return [self.full_name(i, s) for i in range(len(self)) for s in self.slots(i) if s.kind != "expert"]

    def set_weight(self, name: str, weight: torch.Tensor) -> None:
        block, slot = self.resolve(name)
        slot.set_weight(block, weight.to(slot.weight(block).dtype))

    # -- roles
    def attention(self, index: int) -> nn.Module | None:
        path = _attention_path(self.blocks[index])
        return None if path is None else self.blocks[index].get_submodule(path)

    def mlp_out(self, index: int, purpose: str = "this technique") -> Slot:
        """The dense MLP's output projection (down_proj / fc2 / c_proj) of block `index`: MEMIT's and the unlearning
        baselines' target. MoE blocks without a dense MLP are refused; the shared expert's down projection is
        used where there is one."""
        layout = self.layout(index)
        outs = [g for g in layout.groups if "mlp_out" in g.roles]
        if not outs:
            raise BadInputError(f"{self.model_type}: block {index} has no dense MLP output projection for {purpose} "
                                f"(its MLP is a mixture of experts without a shared expert)")
        return outs[-1].slots[0]

    def output_norm(self, index: int, slot: Slot) -> str | None:
        """The block-relative path of the post-norm that reads `slot`'s output before the residual add (Gemma 2/3's
        post_feedforward_layernorm on down_proj, OLMo-2's), discovered by the probe; None where the output adds
        straight into the residual stream (Llama, GPT-2, ...)."""
        return self.layout(index).output_norms.get(slot.module)

    def output_shift(self, index: int, slot: Slot, output: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """The change of `slot`'s output (rows `output`) that moves the residual stream by `shift`: `shift` itself
        where the output adds straight in, else its pre-image under the post-norm (`norms.preimage_shift`: exact up
        to the norm's own constraint on its output, which the target is projected onto)."""
        path = self.output_norm(index, slot)
        if path is None:
            return shift
        from toolkit.models.norms import preimage_shift

        layout = self.layout(index)
        return preimage_shift(self.blocks[index].get_submodule(path), layout.norms[path], output, shift)

    # -- outside the blocks
    @property
    def embed_tokens(self) -> nn.Module | None:
        return _safe(self.model.get_input_embeddings)

    @property
    def lm_head(self) -> nn.Module | None:
        return _safe(self.model.get_output_embeddings)

    @property
    def tied(self) -> bool:
        head, embed = self.lm_head, self.embed_tokens
        return head is not None and embed is not None and head.weight is embed.weight

    @property
    def final_norm(self) -> nn.Module | None:
        path = self.final_norm_path
        return None if path is None else self.model.get_submodule(path)

    @property
    def final_norm_path(self) -> str | None:
        """The norm applied after the last block: the decoder's own norm child (model.norm, transformer.ln_f, ...)."""
        parent = self.layers_path.rsplit(".", 1)[0] if "." in self.layers_path else ""
        norms = [name for name, module in self.decoder.named_children() if is_norm(module) and "emb" not in name]
        if len(norms) != 1:
            return None
        return f"{parent}.{norms[0]}" if parent else norms[0]

    # -- sizes
    def dims(self) -> dict:
        """hidden, intermediate (the widest MLP input of a block), heads, head_dim, kv heads, experts."""
        config = getattr(self.config, "text_config", None) or self.config
        block = self.blocks[0]
        slots, _, experts = structural_slots(block)
        embed = self.embed_tokens
        hidden = embed.weight.shape[1] if embed is not None else getattr(config, "hidden_size", None)
        intermediate = max((s.shape(block)[1] for s in slots if s.shape(block)[1] != hidden), default=hidden)
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
        head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else None)
        kv = getattr(config, "num_key_value_heads", None) or heads
        count = block.get_submodule(experts).gate_up_proj.shape[0] if experts else 0
        return {"hidden": hidden, "intermediate": intermediate, "heads": heads, "head_dim": head_dim,
                "kv_heads": kv, "experts": count}

    def describe(self) -> dict:
        """What was discovered (for --dry-run and run.json)."""
        layout = self.layout(0)
        return {"model_type": self.model_type, "blocks": len(self), "layers_path": self.layers_path,
                "groups": [{"role": g.role, "linears": g.names if not g.experts else
                            [f"{g.slots[0].module}.{g.slots[0].param}[0..{len(g.slots) - 1}]"],
                            "norm": g.norm} for g in layout.groups],
                "attention": layout.attention, "parallel": layout.parallel,
                "norms": {p: f"{n.kind}{' (1+w)' if n.offset else ''}" for p, n in layout.norms.items()},
                "post_norms": layout.post_norms, "output_norms": layout.output_norms, "qk_norms": layout.qk_norms,
                "routers": [r.name for r in layout.routers], "tied_embeddings": self.tied,
                "final_norm": self.final_norm_path}


def view_of(model: nn.Module) -> ModelView:
    """The model's view, resolved (and probed) once per model object and kept on it: every consumer of one run
    shares it."""
    view = getattr(model, "_iclrkit_view", None)
    if view is None or view.model is not model:
        view = ModelView(model)
        model.__dict__["_iclrkit_view"] = view  # a plain attribute: not a submodule, not in the state dict
    return view
