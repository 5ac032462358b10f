"""The value (δ) optimisation: cached upper blocks, suffix-only forwards over a prefix KV cache, only the requests still
optimising, grouped by length; EAMET's alignment plugs in as a ValueAlignment.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Protocol

import torch
from torch import nn

from toolkit.edit.config import MemitConfig
from toolkit.edit.context import EditContext
from toolkit.edit.facts import SLOT, EditRequest
from toolkit.edit.keys import Row, pad_rows, prompt_rows
from toolkit.edit.solve import MaskedAdam, project_norm

log = logging.getLogger("iclrkit.edit")


class _CachedBlocks(nn.Module):
    """Stands in for blocks 0..L: returns block L's cached output of the selected rows with δ added at each row's
    subject token."""

    def __init__(self, hidden: torch.Tensor, rows: list[Row], returns_tuple: bool = False):
        super().__init__()
        self.cached, self.rows = hidden, rows
        self.delta: torch.Tensor | None = None
        self.returns_tuple = returns_tuple  # as the blocks it stands in for (Falcon's and BLOOM's loops take [0])

    def select(self, picked: list[int], width: int) -> None:
        device = self.cached.device
        self.hidden = self.cached[picked, :width]
        self.row_index = torch.arange(len(picked), device=device)
        self.subject_index = torch.tensor([self.rows[i].subject_index for i in picked], device=device)
        self.request = torch.tensor([self.rows[i].request for i in picked], device=device)

    def forward(self, hidden_states, *args, **kwargs):
        add = torch.zeros_like(self.hidden)
        add = add.index_put((self.row_index, self.subject_index), self.delta[self.request])
        return (self.hidden + add,) if self.returns_tuple else self.hidden + add


class _Passthrough(nn.Module):
    """Stands in for a block below L: hands its input on (block L's stub then replaces it by the cached output)."""

    def __init__(self, returns_tuple: bool = False):
        super().__init__()
        self.returns_tuple = returns_tuple

    def forward(self, hidden_states, *args, **kwargs):
        return (hidden_states,) if self.returns_tuple else hidden_states


@contextlib.contextmanager
def upper_blocks_only(ectx: EditContext, stub: nn.Module, last_edit_layer: int):
    """Temporarily replace blocks 0..L-1 by pass-throughs and block L by `stub`, so a forward runs only blocks L+1..
    on the cached states. The list keeps its length: models with per-layer attention types (Gemma 2/3, ...) pick
    each block's mask and rotary embedding by its position in the list (`config.layer_types[i]`)."""
    base, name = ectx.base, ectx.blocks_name
    original = getattr(base, name)
    below = [_Passthrough(getattr(stub, "returns_tuple", False)) for _ in range(last_edit_layer)]
    setattr(base, name, nn.ModuleList([*below, stub, *list(original)[last_edit_layer + 1:]]))
    try:
        yield
    finally:
        setattr(base, name, original)


class ValueAlignment(Protocol):
    """An extra per-request loss on δ (EAMET's embedding alignment), what a registered edit method may return.
    edit/run.py and optimise_values call exactly these members (tests/unit/test_edit_registry.py runs an edit with
    an object that has nothing else). Requests are numbered within the current batch."""

    # True: request i's loss depends on the final δ of the requests before it, so requests are optimised one at a
    # time (EAMET); False: chunks of config.opt_batch requests are optimised together, as MEMIT's.
    sequential: bool

    def begin_batch(self, keys_z: torch.Tensor) -> None:
        """Before a batch's values are optimised: its requests' keys at the last edit layer, (n, d_k)."""

    def loss(self, delta: torch.Tensor, span: range) -> torch.Tensor:
        """The extra loss of the requests in `span` given their current δ (len(span), d): one value per request."""

    def record(self, delta: torch.Tensor, span: range) -> None:
        """After the requests in `span` are optimised: their final δ."""


class EditMethod(Protocol):
    """A registered edit method (`@register("edit", NAME, config=...)`, toolkit/edit/methods/): MEMIT's pipeline
    with the value strategy it returns for its config, a ValueAlignment or None (MEMIT's plain objective)."""

    def __call__(self, config: MemitConfig) -> ValueAlignment | None: ...


def optimise_values(ectx: EditContext, requests: list[EditRequest], keys_z: torch.Tensor, config: MemitConfig,
                    layer: int, alignment: ValueAlignment | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """δ for every request (prompts under ectx.templates); returns (δ, h, final target NLL): (n, d), (n, d), (n,).

    Chunks of config.opt_batch requests are optimised together: each row is its own problem (MaskedAdam,
    per-request early stop), so a chunk gives the δ each request gets alone. An alignment that declares itself
    `sequential` (EAMET: request i's loss depends on the final δ of the requests before it) gets one request at a
    time, as in the official code: a batched chunk would let them see each other's moving δ and give other δ."""
    deltas, inits, nlls = [], [], []
    size = 1 if alignment is not None and alignment.sequential else config.opt_batch
    chunks = range(0, len(requests), size)
    for start in (ectx.progress(chunks, description="values") if ectx.progress else chunks):
        span = range(start, min(start + size, len(requests)))
        extra = (lambda d, s=span: alignment.loss(d, s)) if alignment is not None else None
        delta, init, nll = _optimise_chunk(ectx, [requests[i] for i in span], keys_z[span.start:span.stop],
                                           config, layer, extra)
        if alignment is not None:
            alignment.record(delta, span)
        deltas.append(delta)
        inits.append(init)
        nlls.append(nll)
    return torch.cat(deltas), torch.cat(inits), torch.cat(nlls)


def length_groups(rows: list[Row], picked: list[int], slack: float = 1.25, extra: int = 2) -> list[list[int]]:
    """The picked rows sorted by length and cut wherever a row is longer than slack × its group's shortest + extra
    tokens: each forward pads little, and short rows do not split into many tiny forwards."""
    groups: list[list[int]] = []
    for i in sorted(picked, key=lambda i: len(rows[i].ids)):
        if not groups or len(rows[i].ids) > slack * len(rows[groups[-1][0]].ids) + extra:
            groups.append([])
        groups[-1].append(i)
    return groups


class _SuffixRunner:
    """Runs blocks L+1.. on each row from its subject's last token on. The tokens before it are the same at every
    step (δ enters at the subject), so their keys and values come from one cached forward of the unedited model;
    rows sit left-padded in that cache and carry their own positions."""

    def __init__(self, ectx: EditContext, rows: list[Row], layer: int):
        from toolkit.models.adapters import cache_kwarg

        self.ectx, self.pad, self.device = ectx, ectx.pad, ectx.device
        starts = [r.subject_index for r in rows]
        self.rows = [Row(ids=r.ids[p:], subject_index=0, request=r.request, target_start=r.target_start - p,
                         targets=r.targets) for r, p in zip(rows, starts)]
        self.starts = torch.tensor(starts, device=self.device)
        self.cache_name = cache_kwarg(ectx.base)
        self.prefix_mask, self.prefix_cache = self._encode_prefixes(rows, starts)
        self.stub = _CachedBlocks(self._block_outputs(layer), self.rows, ectx.view.layout(layer).returns_tuple)
        self.selected: dict[tuple[int, ...], object] = {}

    @torch.no_grad()
    def _encode_prefixes(self, rows: list[Row], starts: list[int]):
        width = max(max(starts), 1)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, (row, p) in enumerate(zip(rows, starts)):
            if p:
                ids[b, width - p:] = torch.tensor(row.ids[:p])
                mask[b, width - p:] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (torch.arange(width, device=self.device)[None] - (width - self.starts)[:, None]).clamp_min(0)
        # a row without prefix attends to its padding here, never later: a query with no key could give NaN
        attend = torch.where(mask.sum(1, keepdim=True) == 0, torch.ones_like(mask), mask)
        out = self.ectx.base(input_ids=ids, attention_mask=attend, position_ids=positions, use_cache=True)
        return mask, getattr(out, self.cache_name)

    @torch.no_grad()
    def _block_outputs(self, layer: int) -> torch.Tensor:
        """Block L's output on every suffix token of the unedited model (what the stub feeds blocks L+1..)."""
        from toolkit.nn.hooks import capture

        everything = list(range(len(self.rows)))
        with capture(self.ectx.model, [self.ectx.block(layer)], what="output") as records:
            self.ectx.base(**self._inputs(everything, copy.deepcopy(self.prefix_cache)))
        return records[self.ectx.block(layer)][0].float()

    def subject_states(self, picked: list[int]) -> torch.Tensor:
        """Block L's output at the subject's last token of the picked rows, before any δ."""
        return self.stub.cached[picked, 0]

    def _cache_of(self, picked: list[int]):
        key = tuple(picked)
        if key not in self.selected:
            if len(self.selected) >= 32:  # compositions of earlier steps, before requests finished
                self.selected.clear()
            cache = copy.deepcopy(self.prefix_cache)
            cache.batch_select_indices(torch.tensor(picked, device=self.device))
            self.selected[key] = cache
        return copy.deepcopy(self.selected[key])  # the forward appends the suffix to the copy

    def _inputs(self, picked: list[int], cache) -> dict:
        ids, suffix_mask = pad_rows([self.rows[i] for i in picked], self.pad, self.device)
        index = torch.tensor(picked, device=self.device)
        positions = self.starts[index][:, None] + torch.arange(ids.shape[1], device=self.device)
        mask = torch.cat([self.prefix_mask[index], suffix_mask], dim=1)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "use_cache": True,
                self.cache_name: cache}

    def forward(self, picked: list[int]) -> torch.Tensor:
        """(len(picked), width, d): the last hidden states of the picked rows' suffixes, padded to their longest."""
        inputs = self._inputs(picked, self._cache_of(picked))
        self.stub.select(picked, inputs["input_ids"].shape[1])
        return self.ectx.base(**inputs).last_hidden_state


def _target_nll(lm_head: nn.Module, last: torch.Tensor, rows: list[Row], picked: list[int], n: int,
                prompts_per_request: torch.Tensor) -> torch.Tensor:
    """Per request: the mean over its prompts of the mean target-token NLL (0 for requests without picked rows)."""
    where, labels, owners, weights = [], [], [], []
    for k, i in enumerate(picked):
        row = rows[i]
        for j, token in enumerate(row.targets):
            where.append((k, row.target_start + j))
            labels.append(token)
            owners.append(row.request)
            weights.append(1.0 / len(row.targets))
    device = last.device
    at = torch.tensor(where, device=device)
    logp = torch.log_softmax(lm_head(last[at[:, 0], at[:, 1]]).float(), dim=-1)
    token_nll = -logp.gather(1, torch.tensor(labels, device=device)[:, None]).squeeze(1)
    token_nll = token_nll * torch.tensor(weights, device=device)
    owner = torch.tensor(owners, device=device)
    return torch.zeros(n, device=device).index_add(0, owner, token_nll) / prompts_per_request


def _start(config: MemitConfig, h_init: torch.Tensor, keys_z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(δ's start, the bound of ‖δ‖ per request): 0 or EAMET's ‖k‖·h/‖h‖ (where ‖h‖ < 100); clamp_factor·‖h‖
    (MEMIT) or ·‖k‖ (EAMET)."""
    delta = torch.zeros_like(h_init)
    if config.init == "target":
        key_norm = keys_z.norm(dim=-1, keepdim=True)
        h_norm = h_init.norm(dim=-1, keepdim=True)
        delta = torch.where(h_norm < 100, key_norm * h_init / h_norm.clamp_min(1e-12), delta)
    max_norm = config.clamp_factor * (h_init.norm(dim=-1) if config.clamp == "h" else keys_z.norm(dim=-1))
    return delta, max_norm


def _essence_kl(runner: _SuffixRunner, lm_head: nn.Module, picked: list[int], n: int, kl_init: torch.Tensor,
                first: bool) -> torch.Tensor:
    """Per request: KL(now ‖ start) of the next-token distribution after "{subject} is a" (the essence rows
    `picked`); on the first step the start distributions are stored in kl_init."""
    device = kl_init.device
    kl = torch.zeros(n, device=device)
    suffixes = runner.rows
    for group in length_groups(suffixes, picked):
        last = runner.forward(group)
        ends = torch.tensor([len(suffixes[i].ids) - 1 for i in group], device=device)
        owner = torch.tensor([suffixes[i].request for i in group], device=device)
        ess = torch.log_softmax(lm_head(last[torch.arange(len(group)), ends]).float(), dim=-1)
        if first:
            kl_init[owner] = ess.detach()
        kl = kl.index_add(0, owner, (ess.exp() * (ess - kl_init[owner])).sum(-1))  # KL(now ‖ start)
    return kl


def _optimise_chunk(ectx: EditContext, requests, keys_z, config, layer, alignment):
    tokenizer, templates, device, lm_head = ectx.tokenizer, ectx.templates, ectx.device, ectx.lm_head
    rows = prompt_rows(tokenizer, requests, templates, with_target=True)
    essence = [EditRequest(prompt=SLOT + " is a", subject=r.subject, target_new=r.target_new, record_id=r.record_id)
               for r in requests]
    essence_rows = prompt_rows(tokenizer, essence, [""], with_target=False)
    runner = _SuffixRunner(ectx, rows + essence_rows, layer)
    suffixes = runner.rows
    h_init = runner.subject_states([i for i in range(len(rows)) if i % len(templates) == 0])  # template ""

    delta, max_norm = _start(config, h_init, keys_z)
    n = len(requests)
    prompts_per_request = torch.bincount(torch.tensor([r.request for r in rows]), minlength=n).float().to(device)
    adam = MaskedAdam(delta.shape, config.v_lr, device=device)
    active = torch.ones(n, dtype=torch.bool, device=device)
    nll = torch.zeros(n, device=device)
    kl_init = torch.zeros(n, lm_head.weight.shape[0], device=device)  # essence log-probs before the edit
    with upper_blocks_only(ectx, runner.stub, layer):
        for step in range(config.v_num_grad_steps):
            live = active.nonzero().flatten()
            delta.requires_grad_(True)
            runner.stub.delta = delta
            step_nll = torch.zeros(n, device=device)
            for group in length_groups(suffixes, [i for i, r in enumerate(rows) if active[r.request]]):
                last = runner.forward(group)
                step_nll = step_nll + _target_nll(lm_head, last, suffixes, group, n, prompts_per_request)
            kl = _essence_kl(runner, lm_head, [len(rows) + int(q) for q in live], n, kl_init, step == 0)
            loss = step_nll + config.kl_factor * kl
            loss = loss + config.v_weight_decay * delta.norm(dim=-1) / h_init.norm(dim=-1).square()
            if alignment is not None:
                loss = loss + alignment(delta)
            loss = loss[live]
            nll[live] = step_nll.detach()[live]
            log.debug("value step %d: mean target NLL %.3f, mean loss %.3f, live %d", step,
                      float(nll.mean()), float(loss.detach().mean()), len(live))
            keep = loss.detach() >= config.early_stop_loss
            active[live[~keep]] = False
            if step == config.v_num_grad_steps - 1 or not active.any():
                break
            grad, = torch.autograd.grad(loss[keep].sum(), delta)
            delta = delta.detach()
            adam.step(delta, grad, active)
            delta = project_norm(delta, max_norm)
    return delta.detach(), h_init, nll
