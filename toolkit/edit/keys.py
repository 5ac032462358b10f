"""MEMIT's keys: prompt rows with the subject position, subject-token states and the keys k (mean of per-context-type
means, as the official compute_ks). Where the blocks live comes from the EditContext's ModelView.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from toolkit.core.errors import BadInputError
from toolkit.edit.context import EditContext
from toolkit.edit.facts import SLOT, EditRequest

log = logging.getLogger("iclrkit.edit")


def default_layers(n_layers: int) -> list[int]:
    return [3, 4] if n_layers >= 8 else [max(0, n_layers // 2 - 1), n_layers // 2] if n_layers > 1 else [0]


def check_layers(layers: list[int], n_layers: int) -> list[int]:
    if not layers:
        raise BadInputError("layers must name at least one edit layer")
    bad = [l for l in layers if not 0 <= l < n_layers]
    if bad:
        raise BadInputError(f"edit layers {bad} out of range: the model has {n_layers} blocks (0..{n_layers - 1})")
    if sorted(set(layers)) != list(layers):
        raise BadInputError(f"edit layers must be increasing and distinct, got {layers}")
    return list(layers)


@dataclass
class Row:
    """One tokenised sequence: ids, the subject's last-token index, and the target positions it scores."""

    ids: list[int]
    subject_index: int
    request: int  # index of the request the row belongs to
    target_start: int = -1  # position whose next-token prediction is the first target token
    targets: tuple[int, ...] = ()


def encode_with_subject(tokenizer, text: str, subject_end: int, where: str) -> tuple[list[int], int]:
    ids = tokenizer(text)["input_ids"]
    head = tokenizer(text[:subject_end])["input_ids"]
    if not head or not ids:
        raise BadInputError(f"{where}: prompt tokenizes to nothing")
    return ids, min(len(head), len(ids)) - 1


def target_ids(tokenizer, target: str, where: str) -> list[int]:
    ids = tokenizer(" " + target.strip(), add_special_tokens=False)["input_ids"]
    if not ids:
        raise BadInputError(f"{where}: target {target!r} tokenizes to nothing")
    return ids


def prompt_rows(tokenizer, requests: list[EditRequest], templates: list[str], with_target: bool) -> list[Row]:
    """Every request under every context template; with_target appends the new object (teacher forcing)."""
    rows = []
    for index, request in enumerate(requests):
        target = target_ids(tokenizer, request.target_new, request.record_id) if with_target else []
        for template in templates:
            text = template + request.text
            subject_end = len(template) + request.prompt.index(SLOT) + len(request.subject)
            ids, subject_index = encode_with_subject(tokenizer, text, subject_end, request.record_id)
            rows.append(Row(ids=ids + target[:-1], subject_index=subject_index, request=index,
                            target_start=len(ids) - 1, targets=tuple(target)))
    return rows


def pad_rows(rows: list[Row], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row.ids)] = torch.tensor(row.ids)
        mask[i, :len(row.ids)] = 1
    return ids.to(device), mask.to(device)


def at_subject(values: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """values (B, T, d) -> (B, d) at each row's subject index."""
    index = torch.tensor([r.subject_index for r in rows], device=values.device)
    return values[torch.arange(len(rows), device=values.device), index]


@torch.no_grad()
def subject_states(ectx: EditContext, rows: list[Row], paths: list[str], what: str) -> dict[str, torch.Tensor]:
    """Each path's input or output at the subject's last token of every row: {path: (n_rows, d)}."""
    from toolkit.nn.hooks import capture

    out: dict[str, list[torch.Tensor]] = {p: [] for p in paths}
    for start in range(0, len(rows), ectx.batch):
        chunk = rows[start:start + ectx.batch]
        ids, mask = pad_rows(chunk, ectx.pad, ectx.device)
        with capture(ectx.model, paths, what=what) as records:
            ectx.model(input_ids=ids, attention_mask=mask)
        for path in paths:
            # OPT flattens the tokens to (B·T, d) before its MLP: back to (B, T, d)
            values = records[path][0].float().reshape(ids.shape[0], ids.shape[1], -1)
            out[path].append(at_subject(values, chunk))
    return {p: torch.cat(v) for p, v in out.items()}


def context_type_weights(templates: list[str]) -> list[float]:
    """Weight of each template in a key: the official compute_ks (MEMIT and EAMET) averages within each context
    type (the bare prompt "{}"; the generated prefixes, all of one length) and then over the types, so the bare
    prompt counts 1/2 and each of n prefixes 1/(2n), not 1/(n+1) each."""
    bare = [t == "" for t in templates]
    types = [n for n in (sum(bare), len(templates) - sum(bare)) if n]
    return [1.0 / (len(types) * (sum(bare) if b else len(templates) - sum(bare))) for b in bare]


def compute_keys(ectx: EditContext, requests: list[EditRequest], layers: list[int]) -> dict[int, torch.Tensor]:
    """k at each layer: the down-projection input at the subject's last token, the mean over context types of the
    mean over that type's templates (ectx.templates, weighted by context_type_weights)."""
    templates, device = ectx.templates, ectx.device
    rows = prompt_rows(ectx.tokenizer, requests, templates, with_target=False)
    states = subject_states(ectx, rows, [ectx.down(l) for l in layers], "input")
    weights = torch.tensor(context_type_weights(templates) * len(requests), device=device)[:, None]
    index = torch.tensor([r.request for r in rows], device=device)
    return {l: torch.zeros(len(requests), states[ectx.down(l)].shape[-1], device=device).index_add_(
        0, index, weights * states[ectx.down(l)]) for l in layers}


def block_outputs(ectx: EditContext, requests: list[EditRequest], layer: int) -> torch.Tensor:
    """h: the output of block `layer` at the subject's last token of the bare prompt, (n, d)."""
    rows = prompt_rows(ectx.tokenizer, requests, [""], with_target=False)
    return subject_states(ectx, rows, [ectx.block(layer)], "output")[ectx.block(layer)]
