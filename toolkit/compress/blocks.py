"""The per-block work of a compress run (toolkit.compress.recipe runs it through the sequential pipeline): each
group of slots gets its Hessians (one shared by a plain group's linears; one per expert, from its routed tokens, for
fused experts), the method solves, the weights are written back through the slots, and scales, g_idx and the kept
weights are collected. Starved experts get the configured fallback; run.json lists every expert's tokens.
The solve of a group (`solve(weights, H, config, dtype)`) is the recipe's, handed in."""

from __future__ import annotations

G_IDX = "::g_idx"  # checkpoint key suffix of a linear's activation-ordered group index (never a module path)


class BlockCompressor:
    """The per-block work of a compress run: each sequential group's Hessians → the method's solves → weights
    written back through the slots; scales and g_idx collected by full slot name; kept weights counted."""

    def __init__(self, view, windows, config, ctx, solve):
        import torch

        from toolkit.models.memory import block_dims

        self.view, self.config, self.ctx = view, config, ctx
        self.solve = solve
        self.dtype = getattr(torch, config.solve_dtype)
        self.scales: dict = {}
        self.counts = {"kept": 0, "total": 0}
        self.fused = config.fused_calibration_fits(windows.shape[0], windows.shape[1], block_dims(view))
        self.all_tokens = config.moe_calibration == "all"

    def mode(self) -> str:
        return "fused" if self.fused else "per-group" if self.config.true_sequential else "one-pass"

    def on_block(self, step, checkpoints=None) -> None:
        from safetensors.torch import save_file

        block_scales: dict = {}
        groups = self.groups(step.layout)
        if self.fused and not step.batchable:
            self.fused = False  # the model's per-window arguments do not batch (BLOOM's ALiBi): one window at a time
            self.ctx.metrics["calibration"] = self.mode()
        if self.fused:  # each group compressed as its input arrives in one batched forward, which also propagates
            step.calibrate_in_one_forward(
                groups, lambda index, tap: self.compress_group(step, groups[index], tap, block_scales), self.dtype,
                self.all_tokens)
        elif not self.config.true_sequential:  # every group's H from one forward through the block as it came in
            for group, tap in zip(groups, step.group_hessians(groups, self.dtype, self.all_tokens)):
                self.compress_group(step, group, tap, block_scales)
        else:
            for group in groups:
                tap, = step.group_hessians([group], self.dtype, self.all_tokens)
                self.compress_group(step, group, tap, block_scales)
        self.scales.update(block_scales)
        if checkpoints is not None and block_scales:
            save_file(block_scales, str(checkpoints / f"scales_{step.index}.safetensors"))

    def groups(self, layout) -> list:
        """The layout's groups, with each router as a group of its own just before the experts when
        quantize_routers is set (routers read the MLP's input, as the experts do)."""
        if not (self.config.quantize_routers and layout.routers):
            return layout.groups
        from toolkit.models.layout import Group

        routers = [Group([router], router.module, "router") for router in layout.routers]
        at = next((i for i, g in enumerate(layout.groups) if g.experts), len(layout.groups))
        return layout.groups[:at] + routers + layout.groups[at:]

    def compress_group(self, step, group, tap, block_scales) -> None:
        import torch


        accumulators = tap.accumulators()
        for accumulator in {id(a): a for a in accumulators.values()}.values():
            accumulator.all_reduce()  # H over every rank's windows under torch.distributed; a no-op in one process
        rtn = set()
        if group.experts:
            accumulators, rtn = self.starved_experts(step, group, tap, accumulators)
        batches = [group.slots] if not group.experts else [[slot] for slot in group.slots]
        for slots in batches:
            weights = [slot.weight(step.block) for slot in slots]
            config = self.config if slots[0].name not in rtn else self.rtn_config
            hessian = accumulators[slots[0].name].H if slots[0].name not in rtn else None
            solved = self.solve(weights, hessian, config, self.dtype)
            for slot, weight, (new, grid) in zip(slots, weights, solved):
                slot.set_weight(step.block, new.to(weight.dtype))
                if grid is not None:
                    name = self.view.full_name(step.index, slot)
                    block_scales[name] = grid.scales.float().contiguous()
                    if grid.g_idx is not None:
                        block_scales[f"{name}{G_IDX}"] = grid.g_idx.to(torch.int32).contiguous()

    @property
    def rtn_config(self):
        from toolkit.compress.config import RtnConfig

        shared = {k: v for k, v in self.config.model_dump().items() if k in RtnConfig.model_fields}
        return RtnConfig(**{**shared, "method": "rtn"})

    def starved_experts(self, step, group, tap, accumulators):
        """Experts under moe_min_tokens routed tokens: warned about, then calibrated on every token (their Hessian
        from the tokens this tap saw) or quantized by RTN, as moe_fallback says. Returns (accumulators, slot names
        to round to nearest)."""
        config = self.config
        name = self.view.full_name(step.index, group.slots[0].module)
        record_expert_tokens(self.ctx, name, tap.tokens, config.moe_min_tokens)
        starved = {slot.expert for slot in group.slots if tap.tokens[slot.name] < config.moe_min_tokens}
        if not starved or config.moe_calibration == "all":
            return accumulators, set()
        if config.moe_fallback == "refuse":
            from toolkit.core.errors import BadInputError

            raise BadInputError(f"{name}: experts {sorted(starved)} saw fewer than {config.moe_min_tokens} "
                                "calibration tokens", "give more calibration data, or set moe_fallback=all-tokens|rtn")
        self.ctx.metrics.setdefault("expert_fallback", {})[f"{name}.{group.slots[0].param}"] = {
            "experts": sorted(starved), "fallback": config.moe_fallback}
        if config.moe_fallback == "rtn":
            return accumulators, {s.name for s in group.slots if s.expert in starved}
        fallback = tap.all_token_fallback(starved).accumulators()
        for accumulator in fallback.values():
            accumulator.all_reduce()
        return {**accumulators, **fallback}, set()

    def count(self, block, layout) -> None:
        for slot in [s for g in self.groups(layout) for s in g.slots]:
            weight = slot.weight(block)
            self.counts["kept"] += int((weight != 0).sum())
            self.counts["total"] += weight.numel()


def record_expert_tokens(ctx, experts: str, tokens: dict[str, int], threshold: int) -> None:
    """run.json lists, per fused experts projection, the calibration tokens each expert saw; an expert under
    `threshold` tokens gets a warning (its Hessian is nearly empty: the solve leans on the damping alone)."""
    per_param: dict[str, dict[int, int]] = {}
    for name, count in tokens.items():
        param, expert = name.rsplit(".", 2)[-2:]
        per_param.setdefault(param, {})[int(expert)] = count
    table = ctx.metrics.setdefault("expert_tokens", {})
    for param, counts in per_param.items():
        table[f"{experts}.{param}"] = [counts[e] for e in sorted(counts)]
    starved = sorted({int(n.rsplit(".", 1)[1]) for n, c in tokens.items() if c < threshold})
    if starved:
        ctx.warn(f"{experts}: experts {starved} saw fewer than {threshold} calibration tokens")
