"""ModelView: what every technique needs to know about a model's architecture, discovered from the model itself.

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
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError
from toolkit.models import archs

log = logging.getLogger("iclrkit")

EXPERT_IN, EXPERT_OUT = "gate_up_proj", "down_proj"  # transformers 5 fused expert tensors


# -- one weight matrix ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """One weight matrix a technique may change: a Linear / Conv1D module's weight, a router's weight, or expert `e` of
    a fused 3-D expert parameter. `name` is block-relative ("self_attn.q_proj", "mlp.experts.gate_up_proj.3")."""

    name: str
    module: str  # block-relative path of the module that owns the parameter
    kind: str  # "linear" | "conv1d" | "expert" | "router"
    param: str = "weight"
    expert: int | None = None

    def tensor(self, block: nn.Module) -> torch.Tensor:
        return getattr(block.get_submodule(self.module), self.param)

    def weight(self, block: nn.Module) -> torch.Tensor:
        """(out, in): a view for Linear / router / expert slices, a transposed view for Conv1D."""
        data = self.tensor(block).data
        if self.kind == "expert":
            return data[self.expert]
        return data.t() if self.kind == "conv1d" else data

    def set_weight(self, block: nn.Module, weight: torch.Tensor) -> None:
        self.weight(block).copy_(weight)

    def shape(self, block: nn.Module) -> tuple[int, int]:
        """(out, in) from the parameter's shape (no data needed: works on meta tensors)."""
        shape = tuple(self.tensor(block).shape)
        if self.kind == "expert":
            return shape[1], shape[2]
        return (shape[1], shape[0]) if self.kind == "conv1d" else (shape[0], shape[1])


@dataclass
class Group:
    """Slots whose inputs arrive together: the same tensor (q/k/v; gate/up) or, for fused experts, one expert each
    with its own routed tokens. `anchor` is the block-relative module whose forward input is the group's input."""

    slots: list[Slot]
    anchor: str
    role: str  # attn_in | attn_out | mlp_in | mlp_out | experts_in | experts_out | "attn_in+mlp_in" (parallel)
    norm: str | None = None  # the norm whose output this group reads (pre-norm), if any
    experts: bool = False
    roles: set[str] = field(default_factory=set)

    @property
    def reads_residual(self) -> bool:
        return bool(self.roles & {"attn_in", "mlp_in", "experts_in"})

    @property
    def writes_residual(self) -> bool:
        return bool(self.roles & {"attn_out", "mlp_out", "experts_out"})

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]


@dataclass
class NormInfo:
    path: str  # block-relative ("" prefix for model-level norms: full path)
    kind: str  # "rmsnorm" | "layernorm"
    offset: float  # effective scale = offset + weight (Gemma's (1 + w): 1.0; plain: 0.0)
    has_bias: bool


@dataclass
class BlockLayout:
    """The discovered structure of one kind of block (blocks with the same modules and shapes share it)."""

    groups: list[Group]
    attention: str | None
    norms: dict[str, NormInfo] = field(default_factory=dict)
    pre_norms: list[str] = field(default_factory=list)  # norms feeding a group of linears
    qk_norms: list[str] = field(default_factory=list)  # norms inside attention (q/k norms on projection outputs)
    post_norms: list[str] = field(default_factory=list)  # every other norm (on a branch output before the residual)
    routers: list[Slot] = field(default_factory=list)
    experts: str | None = None  # block-relative path of the fused experts module
    parallel: bool = False  # attention and MLP read the same input (GPT-J, Falcon, Phi, Cohere)
    returns_tuple: bool = False  # the block returns (hidden, ...) (Falcon, BLOOM), not the hidden states alone

    @property
    def slots(self) -> list[Slot]:
        return [s for g in self.groups for s in g.slots]

    def groups_of(self, role: str) -> list[Group]:
        return [g for g in self.groups if role in g.roles]


# -- structure (no forward needed: works on a meta skeleton) --------------------------------------------------------

def _is_conv1d(module: nn.Module) -> bool:
    return type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None


def is_norm(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return isinstance(module, nn.LayerNorm) or ("norm" in name and "batch" not in name and "group" not in name
                                                 and not list(module.children()))


def is_experts(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    return EXPERT_IN in params and EXPERT_OUT in params and params[EXPERT_IN].dim() == 3


def _router_name(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in archs.ROUTER_NAMES


def structural_slots(block: nn.Module) -> tuple[list[Slot], list[Slot], str | None]:
    """(slots, routers, experts module path) of one block from its module types alone, in registration order."""
    slots, routers, experts = [], [], None
    for name, module in block.named_modules():
        if not name:
            continue
        if is_experts(module):
            if experts is not None:
                raise BadInputError(f"two fused expert modules in one block ({experts}, {name}): not supported")
            experts = name
            count = getattr(module, EXPERT_IN).shape[0]
            for param in (EXPERT_IN, EXPERT_OUT):
                if getattr(module, param).dim() != 3 or getattr(module, param).shape[0] != count:
                    raise BadInputError(f"fused expert tensor {name}.{param} has shape "
                                        f"{tuple(getattr(module, param).shape)}, expected [{count}, out, in]")
                slots += [Slot(f"{name}.{param}.{e}", name, "expert", param, e) for e in range(count)]
            continue
        own = dict(module.named_parameters(recurse=False))
        three_d = [p for p, t in own.items() if t.dim() == 3]
        if three_d and not is_experts(module):
            raise BadInputError(f"{name} holds 3-D parameters {three_d} in a layout this toolkit does not know "
                                f"(fused experts are recognised as {EXPERT_IN} [E, 2I, H] + {EXPERT_OUT} [E, H, I])")
        if isinstance(module, nn.Linear) or _is_conv1d(module):
            kind = "conv1d" if _is_conv1d(module) else "linear"
            (routers if _router_name(name) else slots).append(Slot(name, name, kind))
        elif "router" in type(module).__name__.lower() and own.get("weight") is not None and own["weight"].dim() == 2:
            routers.append(Slot(name, name, "router"))
    return slots, routers, experts


def signature(block: nn.Module) -> tuple:
    return tuple((n, type(m).__name__, tuple((p, tuple(t.shape)) for p, t in m.named_parameters(recurse=False)))
                 for n, m in block.named_modules())


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

def _first_tensor(args, kwargs):
    if args and torch.is_tensor(args[0]):
        return args[0]
    for key in ("hidden_states", "x", "input", "hidden_state"):
        if torch.is_tensor(kwargs.get(key)):
            return kwargs[key]
    return next((v for v in kwargs.values() if torch.is_tensor(v)), None)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same input: one tensor, or a view of the same memory (the probe keeps every tensor alive, so an address is
    never reused while compared). Equal values are not enough: two freshly initialised norms give equal outputs."""
    if a is b:
        return True
    if a.device.type == "meta" or a.numel() != b.numel() or a.dtype != b.dtype:
        return False
    return a.data_ptr() == b.data_ptr() and a.data_ptr() != 0


def _equal_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device.type != "meta" and a.numel() == b.numel() and a.dtype == b.dtype
            and torch.equal(a.reshape(-1), b.reshape(-1)))


def norm_info(path: str, norm: nn.Module) -> NormInfo:
    """Kind and scale convention of a norm, measured: a LayerNorm ignores a constant added to every feature; an RMSNorm
    with a zeroed weight gives 0 (plain) or the normalised input ((1 + w), Gemma)."""
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    width = weight.shape[-1] if weight is not None else None
    if width is None or weight.device.type == "meta":
        return NormInfo(path, "layernorm" if isinstance(norm, nn.LayerNorm) else "rmsnorm", 0.0, bias is not None)
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(3, width, generator=generator) * 4).to(device=weight.device, dtype=torch.float32)
    with torch.no_grad():
        dtype = weight.dtype
        xd = x.to(dtype)
        shifted = norm(xd + 3.0).float()
        plain = norm(xd).float()
        kind = "layernorm" if torch.allclose(shifted, plain, atol=5e-2, rtol=5e-2) else "rmsnorm"
        saved = weight.data.clone()
        saved_bias = bias.data.clone() if bias is not None else None
        try:
            weight.data.zero_()
            if bias is not None:
                bias.data.zero_()
            zeroed = norm(xd).float()
        finally:
            weight.data.copy_(saved)
            if bias is not None:
                bias.data.copy_(saved_bias)
    offset = 0.0 if zeroed.abs().max() < 1e-3 * max(plain.abs().max().item(), 1.0) else 1.0
    return NormInfo(path, kind, offset, bias is not None)


def discover_layout(block: nn.Module, args: tuple, kwargs: dict, hidden: torch.Tensor) -> BlockLayout:
    """Run `block` once on `hidden` (with the args/kwargs the model passes it) with hooks on every module; derive the
    groups, their order and roles, the norms feeding them, and the attention module."""
    slots, routers, experts = structural_slots(block)
    by_module: dict[str, list[Slot]] = {}
    for slot in slots:
        by_module.setdefault(slot.module, []).append(slot)
    modules = dict(block.named_modules())
    attention = _attention_path(block)
    calls: list[tuple[str, torch.Tensor]] = []  # (module path, input) of slot modules in call order
    norm_outputs: list[tuple[str, torch.Tensor]] = []
    handles = []

    def slot_hook(path):
        def hook(module, args, kwargs):
            x = _first_tensor(args, kwargs)
            if x is not None and not any(p == path for p, _ in calls):
                calls.append((path, x))  # the object itself: identity is the test on meta tensors
        return hook

    def norm_hook(path):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if torch.is_tensor(out):
                norm_outputs.append((path, out))
        return hook

    for path in by_module:
        handles.append(modules[path].register_forward_pre_hook(slot_hook(path), with_kwargs=True))
    norms = [p for p, m in modules.items() if p and is_norm(m)]
    for path in norms:
        handles.append(modules[path].register_forward_hook(norm_hook(path)))
    try:
        with torch.no_grad():
            output = block(hidden, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    missing = [p for p in by_module if not any(c == p for c, _ in calls)]
    if missing:
        log.debug("linears never called in a forward (left untouched): %s", missing)
    groups: list[Group] = []
    inputs: list[torch.Tensor] = []
    for path, x in calls:
        own = by_module[path]
        if own[0].kind == "expert":
            groups.append(Group([s for s in own if s.param == EXPERT_IN], path, "experts_in", experts=True))
            groups.append(Group([s for s in own if s.param == EXPERT_OUT], path, "experts_out", experts=True))
            inputs += [x, None]
            continue
        for index, other in enumerate(inputs):
            if other is not None and not groups[index].experts and _same(x, other):
                groups[index].slots += own
                break
        else:
            groups.append(Group(list(own), path, ""))
            inputs.append(x)
    _assign_roles(groups, attention)
    pre = []
    for group, x in zip(groups, inputs):
        if x is None:
            continue
        match = [path for path, out in norm_outputs if _same(x, out)]
        if not match:  # a copy of the norm's output (a cast, a contiguous()): equal values, if only one norm gives them
            match = [path for path, out in norm_outputs if _equal_values(x, out)]
            match = match if len(match) == 1 else []
        if match:
            group.norm = match[0]
            pre.append(match[0])
    for group in groups:  # fused experts read the MLP's input (a reshaped view of the norm's output)
        if group.role == "experts_in" and group.norm is None:
            twin = next((g for g in groups if g.norm and "mlp_in" in g.roles), None)
            group.norm = twin.norm if twin is not None else None
    info = {p: norm_info(p, modules[p]) for p in norms}
    qk = [p for p in norms if attention and p.startswith(attention + ".") and p not in pre]
    post = [p for p in norms if p not in pre and p not in qk]
    parallel = any("attn_in" in g.roles and ("mlp_in" in g.roles) for g in groups)
    return BlockLayout(groups, attention, info, list(dict.fromkeys(pre)), qk, post, routers, experts, parallel,
                       isinstance(output, tuple))


def _attention_path(block: nn.Module) -> str | None:
    for name, module in block.named_children():
        cls = type(module).__name__.lower()
        if "attention" in cls or "attn" in cls or name in archs.ATTENTION_NAMES:
            return name
    return None


def _assign_roles(groups: list[Group], attention: str | None) -> None:
    """Each slot's role from where it sits: inside the attention module the first group reads the residual stream
    (attn_in) and the last writes it (attn_out); elsewhere, per parent module (mlp, shared_expert, ...), likewise
    mlp_in / mlp_out. A group whose slots share one input may hold several roles (parallel attention + MLP)."""
    by_parent: dict[str, list[int]] = {}
    for index, group in enumerate(groups):
        if group.experts:
            group.roles = {group.role}
            continue
        for slot in group.slots:
            parent = slot.module.rsplit(".", 1)[0] if "." in slot.module else ""
            if attention and (slot.module == attention or slot.module.startswith(attention + ".")):
                parent = attention
            members = by_parent.setdefault(parent, [])
            if index not in members:
                members.append(index)
    roles: dict[int, set[str]] = {i: set() for i in range(len(groups))}
    for parent, members in by_parent.items():
        kind = "attn" if parent == attention else "mlp"
        for position, index in enumerate(members):
            roles[index].add(f"{kind}_out" if position == len(members) - 1 and len(members) > 1 else f"{kind}_in")
    for index, group in enumerate(groups):
        if not group.experts:
            group.roles = roles[index]
            group.role = sorted(roles[index])[0] if len(roles[index]) == 1 else "+".join(sorted(roles[index]))


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
                "post_norms": layout.post_norms, "qk_norms": layout.qk_norms,
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
