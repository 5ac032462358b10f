"""The structure of one kind of decoder block, discovered from the block itself: its slots (every Linear, GPT-2's
Conv1D, each expert of a fused 3-D expert tensor; routers apart) from the module types, and by running it once on a
probe input with hooks, the groups of slots that share an input in the order the inputs arrive, their roles, the
norm each group reads, each norm's kind (measured), and which norms are q/k norms or post-norms.
`toolkit.models.view.ModelView` binds these layouts to a model."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError
from toolkit.models import archs
from toolkit.models.norms import NormInfo, norm_info

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
class BlockLayout:
    """The discovered structure of one kind of block (blocks with the same modules and shapes share it)."""

    groups: list[Group]
    attention: str | None
    norms: dict[str, NormInfo] = field(default_factory=dict)
    pre_norms: list[str] = field(default_factory=list)  # norms feeding a group of linears
    qk_norms: list[str] = field(default_factory=list)  # norms inside attention (q/k norms on projection outputs)
    post_norms: list[str] = field(default_factory=list)  # every other norm (on a branch output before the residual)
    # slot module -> the post-norm that reads its output (Gemma 2/3's post_feedforward_layernorm, OLMo-2's): the slot's
    # output reaches the residual stream only through that norm
    output_norms: dict[str, str] = field(default_factory=dict)
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


def discover_layout(block: nn.Module, args: tuple, kwargs: dict, hidden: torch.Tensor) -> BlockLayout:
    """Run `block` once on `hidden` (with the args/kwargs the model passes it) with hooks on every module; derive the
    groups, their order and roles, the norms feeding them, and the attention module."""
    slots, routers, experts = structural_slots(block)
    by_module: dict[str, list[Slot]] = {}
    for slot in slots:
        by_module.setdefault(slot.module, []).append(slot)
    modules = dict(block.named_modules())
    norms = [p for p, m in modules.items() if p and is_norm(m)]
    calls, norm_outputs, output, flows = _record(block, (hidden, args, kwargs), {p: modules[p] for p in by_module},
                                                 {p: modules[p] for p in norms})
    groups, inputs = _group_calls(calls, by_module)
    attention = _attention_path(block)
    _assign_roles(groups, attention)
    pre = _attach_norms(groups, inputs, norm_outputs)
    info = {p: norm_info(p, modules[p]) for p in norms}
    qk = [p for p in norms if attention and p.startswith(attention + ".") and p not in pre]
    post = [p for p in norms if p not in pre and p not in qk]
    parallel = any("attn_in" in g.roles and ("mlp_in" in g.roles) for g in groups)
    fed = {slot: norm for slot, norm in _output_norms(flows).items() if norm in post}
    return BlockLayout(groups, attention, info, pre, qk, post, fed, routers, experts, parallel,
                       isinstance(output, tuple))


def _output_norms(flows: dict) -> dict[str, str]:
    """slot module -> the norm whose input is that slot's output (the same tensor, as the probe saw it)."""
    outputs, norm_inputs = flows["slot_outputs"], flows["norm_inputs"]
    return {slot: next(norm for norm, x in norm_inputs if _same(x, out)) for slot, out in outputs
            if any(_same(x, out) for _, x in norm_inputs)}


def _record(block, call, slot_modules: dict, norm_modules: dict):
    """One forward of `block` (call = (hidden, args, kwargs)) with hooks: [(slot module path, its input)] in call
    order (first call each), [(norm path, its output)], the block's output, and the flows from slots into norms
    ({"slot_outputs": [(slot module, its output)], "norm_inputs": [(norm path, its input)]}). The tensors themselves
    are kept: identity is what groups them (and what there is to compare on meta tensors)."""
    calls: list[tuple[str, torch.Tensor]] = []
    norm_outputs: list[tuple[str, torch.Tensor]] = []
    flows: dict[str, list] = {"slot_outputs": [], "norm_inputs": []}

    def flow_hook(key, path, take):
        def hook(module, args, *rest):
            x = take(args, rest)
            if torch.is_tensor(x) and not any(p == path for p, _ in flows[key]):
                flows[key].append((path, x))
        return hook

    def slot_hook(path):
        def hook(module, args, kwargs):
            x = _first_tensor(args, kwargs)
            if x is not None and not any(p == path for p, _ in calls):
                calls.append((path, x))
        return hook

    def norm_hook(path):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            if torch.is_tensor(out):
                norm_outputs.append((path, out))
        return hook

    handles = [m.register_forward_pre_hook(slot_hook(p), with_kwargs=True) for p, m in slot_modules.items()]
    handles += [m.register_forward_hook(norm_hook(p)) for p, m in norm_modules.items()]
    handles += [m.register_forward_hook(flow_hook("slot_outputs", p, lambda a, rest: rest[0]))
                for p, m in slot_modules.items()]
    handles += [m.register_forward_pre_hook(flow_hook("norm_inputs", p, lambda a, rest: a[0] if a else None))
                for p, m in norm_modules.items()]
    hidden, args, kwargs = call
    try:
        with torch.no_grad():
            output = block(hidden, *args, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    missing = [p for p in slot_modules if not any(c == p for c, _ in calls)]
    if missing:
        log.debug("linears never called in a forward (left untouched): %s", missing)
    return calls, norm_outputs, output, flows


def _group_calls(calls, by_module) -> tuple[list[Group], list]:
    """Slots whose modules received the same input tensor form one group, in the order inputs arrived; a fused
    experts module gives two groups (gate/up, then down: one slot per expert each)."""
    groups: list[Group] = []
    inputs: list = []
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
    return groups, inputs


def _attach_norms(groups: list[Group], inputs: list, norm_outputs: list) -> list[str]:
    """Each group's norm: the one whose output is the group's input (the same tensor, else equal values from one norm
    only: a cast or contiguous() copy). Fused experts read the MLP's input. Returns the norms that feed groups."""
    pre = []
    for group, x in zip(groups, inputs):
        if x is None:
            continue
        match = [path for path, out in norm_outputs if _same(x, out)]
        if not match:
            match = [path for path, out in norm_outputs if _equal_values(x, out)]
            match = match if len(match) == 1 else []
        if match:
            group.norm = match[0]
            pre.append(match[0])
    for group in groups:
        if group.role == "experts_in" and group.norm is None:
            twin = next((g for g in groups if g.norm and "mlp_in" in g.roles), None)
            group.norm = twin.norm if twin is not None else None
    return list(dict.fromkeys(pre))


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


