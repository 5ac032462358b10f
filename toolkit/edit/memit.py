"""MEMIT: mass-editing memory in a transformer (Meng et al., ICLR 2023), the core EAMET builds on.

Paper: https://arxiv.org/abs/2210.07229 · official code: https://github.com/kmeng01/memit

For each request (s, r, o): keys k (the input of the MLP down-projection at the subject's last token, averaged
over random-prefix contexts) at the edit layers R; a target z = h + δ of the last edit layer's output, where δ
makes the model say o; then, layer by layer, ΔW = resid · Kᵀ (λC + K Kᵀ)⁻¹ with C = E[k kᵀ] over text and
resid = (Z − H_cur) / (layers left). Speed: the δ of many requests are optimised together, and each step runs
only the blocks above the last edit layer on that layer's cached output, only from each subject's last token on (the
tokens before it come from a KV cache), and only for the requests still optimising.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
from pydantic import field_validator
from torch import nn

from toolkit.core.config import BaseConfig
from toolkit.core.errors import BadInputError, RunError
from toolkit.edit.facts import SLOT, EditRequest
from toolkit.edit.value_cache import FILE_NAME as VALUES_FILE
from toolkit.edit.value_cache import facts_digest, load_values, save_values

log = logging.getLogger("iclrkit.edit")

PAPER = "https://arxiv.org/abs/2210.07229"
PREFIX_SEEDS = ("The", "Therefore", "Because", "I", "You", "However", "Also", "Nevertheless", "He", "It", "Can",
                "Because")


class MemitConfig(BaseConfig):
    """MEMIT with the hyperparameters of the official LLaMA configs (EAMET repo's MEMIT baseline).

    Paper https://arxiv.org/abs/2210.07229, code https://github.com/kmeng01/memit."""

    model: str
    data: str  # CounterFact / zsRE / EasyEdit .json or simple .jsonl facts
    n_edits: int | None = None  # first N records (None: all)
    layers: list[int] | None = None  # edit layers R; None: [3, 4] with >= 8 blocks, else the middle two
    mom2_update_weight: float = 15000.0  # λ in (λC + KKᵀ)
    cov_data: str = "embedded"  # text for C = E[kkᵀ]: .txt, .jsonl[:field], embedded, hub id
    cov_tokens: int = 100_000  # tokens streamed for C
    cov_seqlen: int = 128
    stats_dir: str | None = None  # covariance cache; None: $ICLRKIT_CACHE_DIR/edit-stats or ~/.cache/iclrkit/...
    context_prefixes: int = 10  # model-generated prefixes added to the bare "{}" template
    prefix_tokens: int = 10
    v_num_grad_steps: int = 25
    v_lr: float = 0.5
    kl_factor: float = 0.0625  # KL on "{subject} is a" keeps the subject's essence
    v_weight_decay: float = 0.5  # MEMIT's wd · ‖δ‖ / ‖h‖²
    init: Literal["zero", "target"] = "zero"  # δ start: 0, or EAMET's ‖k‖·h/‖h‖ (when ‖h‖ < 100)
    clamp: Literal["h", "ks"] = "h"  # project ‖δ‖ ≤ clamp_factor·‖h‖ (MEMIT) or ·‖k‖ (EAMET fix_ks)
    clamp_factor: float = 0.75
    early_stop_loss: float = 5e-2  # a request stops once its loss is below this
    batch_size: int | None = None  # sequential batched editing: requests per MEMIT update (None: all at once)
    opt_batch: int = 32  # MEMIT: requests whose δ are optimised together (EAMET: one at a time, see optimise_values)
    eval_batch: int = 64
    eval_before: bool = True  # also score the unedited model (baselines)
    fluency_samples: int = 50  # requests whose generation prompts are sampled for the n-gram entropy
    fluency_tokens: int = 50
    save_model: bool = True
    values: str | None = None  # values.safetensors of an earlier run (same model, facts, templates, layers): skip δ

    @field_validator("layers", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        """`--layers 3,4` and `--set layers=3,4` arrive as text."""
        if isinstance(value, str):
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                raise ValueError(f"expected comma-separated integers, got {value!r}") from None
        return value


# ---------------------------------------------------------------- pure math


def closed_form_update(keys: torch.Tensor, resid: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """ΔW = R Kᵀ (λC + K Kᵀ)⁻¹ in float64. keys K: (d_in, n), resid R: (d_out, n), cov C: (d_in, d_in).

    It is the minimiser of ‖ΔW K − R‖² + λ·tr(ΔW C ΔWᵀ): the new keys map to the residuals while the
    preserved keys (second moment C) move as little as possible."""
    K, R, C = keys.double(), resid.double(), cov.double()
    A = lam * C + K @ K.t()
    return torch.linalg.solve(A, K @ R.t()).t()  # A symmetric: (A⁻¹ K Rᵀ)ᵀ = R Kᵀ A⁻¹


def project_norm(delta: torch.Tensor, max_norm: torch.Tensor) -> torch.Tensor:
    """Rows of δ scaled down to ‖δ_i‖ ≤ max_norm_i (unchanged when already inside)."""
    norms = delta.norm(dim=-1, keepdim=True)
    scale = torch.clamp(max_norm.unsqueeze(-1) / norms.clamp_min(1e-12), max=1.0)
    return delta * scale


class MaskedAdam:
    """Adam over the rows of one tensor, where each row is an independent problem with its own step count:
    rows outside `active` are neither moved nor counted, so batching requests equals optimising each alone."""

    def __init__(self, shape, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, device="cpu"):
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = torch.zeros(shape, device=device)
        self.v = torch.zeros(shape, device=device)
        self.t = torch.zeros(shape[0], device=device)

    @torch.no_grad()
    def step(self, param: torch.Tensor, grad: torch.Tensor, active: torch.Tensor) -> None:
        b1, b2 = self.betas
        a = active.unsqueeze(-1)
        self.t += active.float()
        self.m = torch.where(a, b1 * self.m + (1 - b1) * grad, self.m)
        self.v = torch.where(a, b2 * self.v + (1 - b2) * grad * grad, self.v)
        t = self.t.clamp_min(1).unsqueeze(-1)
        m_hat, v_hat = self.m / (1 - b1 ** t), self.v / (1 - b2 ** t)
        param.sub_(torch.where(a, self.lr * m_hat / (v_hat.sqrt() + self.eps), torch.zeros_like(param)))


# ---------------------------------------------------------------- model plumbing


@dataclass
class Arch:
    """Where things live in this model (from the core arch adapter)."""

    layers_path: str
    layers: nn.ModuleList
    down_template: str  # "{layers_path}.{i}.{mlp_down}"
    conv1d: bool
    lm_head: nn.Module
    base: nn.Module  # the module that owns the block list and the final norm

    @classmethod
    def of(cls, model: nn.Module) -> Arch:
        from toolkit.models.adapters import adapter_for, get_module

        adapter = adapter_for(model)
        for path in adapter.layers:
            try:
                layers = get_module(model, path)
            except AttributeError:
                continue
            base = get_module(model, path.rsplit(".", 1)[0])
            return cls(layers_path=path, layers=layers, down_template=f"{path}.{{}}.{adapter.mlp_down}",
                       conv1d=adapter.conv1d, lm_head=get_module(model, adapter.lm_head), base=base)
        raise BadInputError(f"model has none of the block lists {adapter.layers}")

    def down(self, layer: int) -> str:
        return self.down_template.format(layer)

    def block(self, layer: int) -> str:
        return f"{self.layers_path}.{layer}"


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


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)


def at_subject(values: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """values (B, T, d) -> (B, d) at each row's subject index."""
    index = torch.tensor([r.subject_index for r in rows], device=values.device)
    return values[torch.arange(len(rows), device=values.device), index]


@torch.no_grad()
def subject_states(model, arch: Arch, tokenizer, rows: list[Row], paths: list[str], what: str, batch: int,
                   device) -> dict[str, torch.Tensor]:
    """Each path's input or output at the subject's last token of every row: {path: (n_rows, d)}."""
    from toolkit.nn.hooks import capture

    out: dict[str, list[torch.Tensor]] = {p: [] for p in paths}
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        ids, mask = pad_rows(chunk, pad_id(tokenizer), device)
        with capture(model, paths, what=what) as records:
            model(input_ids=ids, attention_mask=mask)
        for path in paths:
            out[path].append(at_subject(records[path][0].float(), chunk))
    return {p: torch.cat(v) for p, v in out.items()}


def context_type_weights(templates: list[str]) -> list[float]:
    """Weight of each template in a key: the official compute_ks (MEMIT and EAMET) averages within each context
    type (the bare prompt "{}"; the generated prefixes, all of one length) and then over the types, so the bare
    prompt counts 1/2 and each of n prefixes 1/(2n), not 1/(n+1) each."""
    bare = [t == "" for t in templates]
    types = [n for n in (sum(bare), len(templates) - sum(bare)) if n]
    return [1.0 / (len(types) * (sum(bare) if b else len(templates) - sum(bare))) for b in bare]


def compute_keys(model, arch: Arch, tokenizer, requests, templates, layers, batch, device) -> dict[int, torch.Tensor]:
    """k at each layer: the down-projection input at the subject's last token, the mean over context types of the
    mean over that type's templates (context_type_weights)."""
    rows = prompt_rows(tokenizer, requests, templates, with_target=False)
    states = subject_states(model, arch, tokenizer, rows, [arch.down(l) for l in layers], "input", batch, device)
    weights = torch.tensor(context_type_weights(templates) * len(requests), device=device)[:, None]
    index = torch.tensor([r.request for r in rows], device=device)
    return {l: torch.zeros(len(requests), states[arch.down(l)].shape[-1], device=device).index_add_(
        0, index, weights * states[arch.down(l)]) for l in layers}


def block_outputs(model, arch: Arch, tokenizer, requests, layer: int, batch: int, device) -> torch.Tensor:
    """h: the output of block `layer` at the subject's last token of the bare prompt, (n, d)."""
    rows = prompt_rows(tokenizer, requests, [""], with_target=False)
    return subject_states(model, arch, tokenizer, rows, [arch.block(layer)], "output", batch, device)[arch.block(layer)]


# ---------------------------------------------------------------- context templates and covariance


@torch.no_grad()
def context_templates(model, tokenizer, n: int, length: int, device) -> list[str]:
    """"" (the bare prompt) plus n model-generated prefixes ending in ". " (the paper's random-prefix prompts)."""
    if n <= 0:
        return [""]
    seeds = [PREFIX_SEEDS[i % len(PREFIX_SEEDS)] for i in range(n)]
    templates = [""]
    for seed in seeds:
        ids = torch.tensor([tokenizer(seed)["input_ids"]], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length, do_sample=True,
                             top_k=100, temperature=0.5, pad_token_id=pad_id(tokenizer))
        text = tokenizer.decode(out[0], skip_special_tokens=True).replace("{", " ").replace("}", " ")
        templates.append(" ".join(text.split()) + ". ")
    return templates


class _StopForward(Exception):
    pass


def model_fingerprint(model) -> str:
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, param in model.named_parameters():
            p = param.detach().double()
            digest.update(f"{name}:{p.sum().item():.10e}:{p.square().sum().item():.10e}".encode())
    return digest.hexdigest()[:16]


def stats_dir(configured: str | None) -> Path:
    if configured:
        return Path(configured).expanduser()
    root = os.environ.get("ICLRKIT_CACHE_DIR", Path.home() / ".cache" / "iclrkit")
    return Path(root).expanduser() / "edit-stats"


@torch.no_grad()
def key_covariance(model, arch: Arch, tokenizer, layers: list[int], text: str, n_tokens: int, seqlen: int,
                   cache: Path, device, progress=None) -> dict[int, torch.Tensor]:
    """C_l = E[k kᵀ] of the down-projection inputs over n_tokens of text (fp64 accumulation, fp32 result),
    cached on disk under a fingerprint of the model, the text, the layer and the sample size."""
    from toolkit.data.text import calibration_windows
    from toolkit.linalg.hessian import HessianAccumulator
    from toolkit.nn.hooks import module_at

    text_sha = hashlib.sha256(text.encode()).hexdigest()[:16]
    base = f"{model_fingerprint(model)}-{text_sha}-{n_tokens}-{seqlen}"
    files = {l: cache / f"cov-{base}-layer{l}.pt" for l in layers}
    covs = {l: torch.load(f, weights_only=True) for l, f in files.items() if f.is_file()}
    todo = [l for l in layers if l not in covs]
    if not todo:
        return covs
    n_windows = max(1, -(-n_tokens // seqlen))
    windows = calibration_windows(tokenizer, text, n_windows, seqlen, seed=0)
    accumulators: dict[int, HessianAccumulator] = {}
    handles = []

    def make(layer):
        def hook(module, args, output):
            x = args[0].detach()
            if layer not in accumulators:
                accumulators[layer] = HessianAccumulator(x.shape[-1], device=x.device)
            accumulators[layer].add(x)
            if layer == todo[-1]:
                raise _StopForward
        return hook

    try:
        for layer in todo:
            handles.append(module_at(model, arch.down(layer)).register_forward_hook(make(layer)))
        batches = range(0, len(windows), 8)
        for start in (progress(batches, description="covariance") if progress else batches):
            with contextlib.suppress(_StopForward):
                model(input_ids=windows[start:start + 8].to(device))
    finally:
        for handle in handles:
            handle.remove()
    cache.mkdir(parents=True, exist_ok=True)
    for layer in todo:
        cov = (accumulators[layer].H / 2).float().cpu()  # the accumulator holds 2/n Σ xxᵀ
        if not torch.isfinite(cov).all():
            raise RunError(f"key covariance of layer {layer} has NaN/Inf entries")
        tmp = files[layer].with_suffix(".tmp")
        torch.save(cov, tmp)
        os.replace(tmp, files[layer])
        covs[layer] = cov
    return covs


# ---------------------------------------------------------------- value (δ) optimisation


class _CachedBlocks(nn.Module):
    """Stands in for blocks 0..L: returns block L's cached output of the selected rows with δ added at each row's
    subject token."""

    def __init__(self, hidden: torch.Tensor, rows: list[Row]):
        super().__init__()
        self.cached, self.rows = hidden, rows
        self.delta: torch.Tensor | None = None

    def select(self, picked: list[int], width: int) -> None:
        device = self.cached.device
        self.hidden = self.cached[picked, :width]
        self.row_index = torch.arange(len(picked), device=device)
        self.subject_index = torch.tensor([self.rows[i].subject_index for i in picked], device=device)
        self.request = torch.tensor([self.rows[i].request for i in picked], device=device)

    def forward(self, hidden_states, *args, **kwargs):
        add = torch.zeros_like(self.hidden)
        add = add.index_put((self.row_index, self.subject_index), self.delta[self.request])
        return self.hidden + add


@contextlib.contextmanager
def upper_blocks_only(arch: Arch, stub: nn.Module, last_edit_layer: int):
    """Temporarily replace blocks 0..L by `stub`, so a forward runs only blocks L+1.. on the cached states."""
    name = arch.layers_path.rpartition(".")[2]
    original = getattr(arch.base, name)
    setattr(arch.base, name, nn.ModuleList([stub, *list(original)[last_edit_layer + 1:]]))
    try:
        yield
    finally:
        setattr(arch.base, name, original)


class ValueAlignment(Protocol):
    """An extra per-request loss on δ (EAMET's embedding alignment); requests are numbered within the batch."""

    def loss(self, delta: torch.Tensor, span: range) -> torch.Tensor: ...

    def record(self, delta: torch.Tensor, span: range) -> None: ...


def optimise_values(model, arch: Arch, tokenizer, requests: list[EditRequest], templates: list[str],
                    keys_z: torch.Tensor, config: MemitConfig, layer: int, device,
                    alignment: ValueAlignment | None = None, progress=None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """δ for every request; returns (δ, h, final target NLL): (n, d), (n, d), (n,).

    Without an alignment, chunks of config.opt_batch requests are optimised together: each row is its own problem
    (MaskedAdam, per-request early stop), so a chunk gives the δ each request gets alone. With an alignment
    (EAMET) request i's loss depends on the final δ of the requests before it, so requests go one at a time, as
    in the official code: a batched chunk would let them see each other's moving δ and give other δ."""
    deltas, inits, nlls = [], [], []
    size = 1 if alignment else config.opt_batch
    chunks = range(0, len(requests), size)
    for start in (progress(chunks, description="values") if progress else chunks):
        span = range(start, min(start + size, len(requests)))
        extra = (lambda d, s=span: alignment.loss(d, s)) if alignment else None
        delta, init, nll = _optimise_chunk(model, arch, tokenizer, [requests[i] for i in span], templates,
                                           keys_z[span.start:span.stop], config, layer, device, extra)
        if alignment:
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

    def __init__(self, model, arch: Arch, rows: list[Row], layer: int, pad: int, device):
        from toolkit.models.adapters import cache_kwarg

        self.arch, self.pad, self.device = arch, pad, device
        starts = [r.subject_index for r in rows]
        self.rows = [Row(ids=r.ids[p:], subject_index=0, request=r.request, target_start=r.target_start - p,
                         targets=r.targets) for r, p in zip(rows, starts)]
        self.starts = torch.tensor(starts, device=device)
        self.cache_name = cache_kwarg(arch.base)
        self.prefix_mask, self.prefix_cache = self._encode_prefixes(rows, starts)
        self.stub = _CachedBlocks(self._block_outputs(model, layer), self.rows)
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
        out = self.arch.base(input_ids=ids, attention_mask=attend, position_ids=positions, use_cache=True)
        return mask, getattr(out, self.cache_name)

    @torch.no_grad()
    def _block_outputs(self, model, layer: int) -> torch.Tensor:
        """Block L's output on every suffix token of the unedited model (what the stub feeds blocks L+1..)."""
        from toolkit.nn.hooks import capture

        everything = list(range(len(self.rows)))
        with capture(model, [self.arch.block(layer)], what="output") as records:
            self.arch.base(**self._inputs(everything, copy.deepcopy(self.prefix_cache)))
        return records[self.arch.block(layer)][0].float()

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
        return self.arch.base(**inputs).last_hidden_state


def _target_nll(arch, last: torch.Tensor, rows: list[Row], picked: list[int], n: int,
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
    logp = torch.log_softmax(arch.lm_head(last[at[:, 0], at[:, 1]]).float(), dim=-1)
    token_nll = -logp.gather(1, torch.tensor(labels, device=device)[:, None]).squeeze(1)
    token_nll = token_nll * torch.tensor(weights, device=device)
    owner = torch.tensor(owners, device=device)
    return torch.zeros(n, device=device).index_add(0, owner, token_nll) / prompts_per_request


def _optimise_chunk(model, arch, tokenizer, requests, templates, keys_z, config, layer, device, alignment):
    rows = prompt_rows(tokenizer, requests, templates, with_target=True)
    essence = [EditRequest(prompt=SLOT + " is a", subject=r.subject, target_new=r.target_new, record_id=r.record_id)
               for r in requests]
    essence_rows = prompt_rows(tokenizer, essence, [""], with_target=False)
    runner = _SuffixRunner(model, arch, rows + essence_rows, layer, pad_id(tokenizer), device)
    suffixes = runner.rows
    h_init = runner.subject_states([i for i in range(len(rows)) if i % len(templates) == 0])  # template ""

    delta = torch.zeros_like(h_init)
    if config.init == "target":
        key_norm = keys_z.norm(dim=-1, keepdim=True)
        h_norm = h_init.norm(dim=-1, keepdim=True)
        delta = torch.where(h_norm < 100, key_norm * h_init / h_norm.clamp_min(1e-12), delta)
    max_norm = config.clamp_factor * (h_init.norm(dim=-1) if config.clamp == "h" else keys_z.norm(dim=-1))

    n = len(requests)
    prompts_per_request = torch.bincount(torch.tensor([r.request for r in rows]), minlength=n).float().to(device)
    adam = MaskedAdam(delta.shape, config.v_lr, device=device)
    active = torch.ones(n, dtype=torch.bool, device=device)
    nll = torch.zeros(n, device=device)
    kl_init = torch.zeros(n, arch.lm_head.weight.shape[0], device=device)  # essence log-probs before the edit
    with upper_blocks_only(arch, runner.stub, layer):
        for step in range(config.v_num_grad_steps):
            live = active.nonzero().flatten()
            delta.requires_grad_(True)
            runner.stub.delta = delta
            step_nll = torch.zeros(n, device=device)
            for group in length_groups(suffixes, [i for i, r in enumerate(rows) if active[r.request]]):
                last = runner.forward(group)
                step_nll = step_nll + _target_nll(arch, last, suffixes, group, n, prompts_per_request)
            kl = torch.zeros(n, device=device)
            for group in length_groups(suffixes, [len(rows) + int(q) for q in live]):
                last = runner.forward(group)
                ends = torch.tensor([len(suffixes[i].ids) - 1 for i in group], device=device)
                owner = torch.tensor([suffixes[i].request for i in group], device=device)
                ess = torch.log_softmax(arch.lm_head(last[torch.arange(len(group)), ends]).float(), dim=-1)
                if step == 0:
                    kl_init[owner] = ess.detach()
                kl = kl.index_add(0, owner, (ess.exp() * (ess - kl_init[owner])).sum(-1))  # KL(now ‖ start)
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


# ---------------------------------------------------------------- insertion


def insert(model, arch: Arch, tokenizer, requests, templates, z: torch.Tensor, layers: list[int],
           covs: dict[int, torch.Tensor], lam: float, batch: int, device) -> dict[int, float]:
    """Spread Z − H across the edit layers in order (MEMIT's closed form); returns ‖ΔW‖ per layer.

    Each layer reaches about kᵀ(λC + KKᵀ)⁻¹k of its share of the residual; kᵀC⁻¹k grows with the key width,
    so a λ tuned for a 7B model (d_ff 11-16k) inserts only part of δ into a small model (see insertion_reach)."""
    from toolkit.models.adapters import linear_weight, set_linear_weight
    from toolkit.nn.hooks import module_at

    norms = {}
    for index, layer in enumerate(layers):
        keys = compute_keys(model, arch, tokenizer, requests, templates, [layer], batch, device)[layer]
        current = block_outputs(model, arch, tokenizer, requests, layers[-1], batch, device)
        resid = (z - current) / (len(layers) - index)
        update = closed_form_update(keys.t(), resid.t(), covs[layer].to(device), lam)
        module = module_at(model, arch.down(layer))
        weight = linear_weight(module, arch.conv1d)
        if not torch.isfinite(update).all():
            raise RunError(f"MEMIT update of layer {layer} has NaN/Inf entries", "raise mom2_update_weight")
        set_linear_weight(module, (weight.double() + update).to(weight.dtype), arch.conv1d)
        norms[layer] = float(update.norm())
    return norms


def insertion_reach(reached: torch.Tensor, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Share of each δ the edited weights produce at the z layer: the projection of (reached − h) on δ / ‖δ‖."""
    return ((reached - h) * delta).sum(-1) / delta.square().sum(-1).clamp_min(1e-12)


# ---------------------------------------------------------------- run


def run_memit(config: MemitConfig, ctx) -> dict:
    return run_editing(config, ctx, technique="edit.memit", paper=PAPER, alignment_factory=None)


def run_editing(config, ctx, technique: str, paper: str, alignment_factory) -> dict:
    """Shared glue of MEMIT and EAMET: load, covariance, (batched) edits, metrics, saved model."""
    import time

    from toolkit.data.text import load_text
    from toolkit.edit.facts import load_facts
    from toolkit.edit.metrics import alignment_spearman, evaluate, write_per_record
    from toolkit.models.source import load_model

    facts = load_facts(config.data, config.n_edits)
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    arch = Arch.of(model)
    layers = check_layers(config.layers if config.layers is not None else default_layers(len(arch.layers)),
                          len(arch.layers))
    for request in facts:  # fail on bad records before any expensive work
        target_ids(tokenizer, request.target_new, request.record_id)
    ctx.inputs.update({"model": config.model, "data": config.data})
    device = ctx.device
    clock = time.perf_counter()
    ctx.record_cache("edit-stats", stats_dir(config.stats_dir))  # written outside --out: named in run.json
    covs = key_covariance(model, arch, tokenizer, layers, load_text(config.cov_data), config.cov_tokens,
                          config.cov_seqlen, stats_dir(config.stats_dir), device, ctx.progress)
    cov_seconds = time.perf_counter() - clock
    templates = context_templates(model, tokenizer, config.context_prefixes, config.prefix_tokens, device)
    before, after = [], []  # per-record scores -> results.jsonl
    if config.eval_before:
        ctx.baselines["unedited"] = evaluate(model, tokenizer, facts, config, device, ctx.progress, per_record=before)
    edit_seconds = 0.0  # keys, values and insertion only: no covariance, no evaluation
    batch = config.batch_size or len(facts)
    identity = {"model": model_fingerprint(model), "facts": facts_digest(facts), "templates": templates,
                "layers": layers}
    saved = None
    if config.values:
        if batch < len(facts):
            raise BadInputError("values can be reused only when all facts are edited in one batch",
                                "later batches' δ depend on the earlier batches' insertion; drop batch_size")
        saved = load_values(config.values, identity)
        ctx.inputs["values"] = config.values
    all_keys, all_deltas, all_h, all_nll, all_reach, per_batch = [], [], [], [], [], []
    alignment = alignment_factory() if alignment_factory and saved is None else None
    for start in range(0, len(facts), batch):
        clock = time.perf_counter()
        chunk = facts[start:start + batch]
        if saved is not None:
            span = slice(start, start + len(chunk))
            keys_z, delta, h, nll = (saved[name][span].to(device) for name in ("keys_z", "delta", "h", "nll"))
        else:
            keys_z = compute_keys(model, arch, tokenizer, chunk, templates, [layers[-1]], config.eval_batch,
                                  device)[layers[-1]]
            if alignment:
                alignment.begin_batch(keys_z)
            delta, h, nll = optimise_values(model, arch, tokenizer, chunk, templates, keys_z, config, layers[-1],
                                            device, alignment, ctx.progress)
        norms = insert(model, arch, tokenizer, chunk, templates, h + delta, layers, covs,
                       config.mom2_update_weight, config.eval_batch, device)
        edit_seconds += time.perf_counter() - clock
        reached = block_outputs(model, arch, tokenizer, chunk, layers[-1], config.eval_batch, device)
        all_reach.append(insertion_reach(reached, h, delta))
        all_nll.append(nll)
        all_keys.append(keys_z)
        all_deltas.append(delta)
        all_h.append(h)
        if config.batch_size:
            scores = evaluate(model, tokenizer, chunk, config, device, None, parts=("efficacy",))
            per_batch.append({"start": start, "size": len(chunk), **scores,
                              **{f"delta_w_norm_layer{l}": v for l, v in norms.items()}})
    save_values(ctx.path(VALUES_FILE), {"delta": torch.cat(all_deltas), "h": torch.cat(all_h),
                                         "nll": torch.cat(all_nll), "keys_z": torch.cat(all_keys)}, identity)
    metrics = evaluate(model, tokenizer, facts, config, device, ctx.progress, per_record=after)
    write_per_record(ctx.path("results.jsonl"), before, after)
    metrics["alignment_spearman"] = alignment_spearman(torch.cat(all_keys), torch.cat(all_deltas))
    # the two stages that must both succeed for a strict edit: δ makes the model say o, the weights produce δ
    metrics["value_nll"] = round(float(torch.cat(all_nll).mean()), 4)
    metrics["insertion_reach"] = round(float(torch.cat(all_reach).mean()), 4)
    if metrics["insertion_reach"] < 0.5:
        log.warning("the edited weights produce only %.0f%% of the target residual δ: lower mom2_update_weight "
                    "(λ, now %g) for this model", 100 * metrics["insertion_reach"], config.mom2_update_weight)
    if config.values:
        metrics["values_from"] = config.values  # δ reused: edit_seconds covers the insertion only
    metrics.update({"n_edits": len(facts), "layers": layers, "edit_seconds": round(edit_seconds, 2),
                    "covariance_seconds": round(cov_seconds, 2)})
    if per_batch:
        metrics["batches"] = per_batch
    ctx.metrics.update(metrics)
    if config.save_model:
        from toolkit.models.save import save_model

        save_model(model, tokenizer, ctx.path("model"), technique=technique, source=config.model, paper=paper,
                   metadata={"technique": technique, "layers": layers, "n_edits": len(facts)})
    (ctx.path("metrics.json")).write_text(json.dumps(metrics, indent=2))
    return metrics


def plan(config: MemitConfig, ctx) -> dict:
    from toolkit.edit.facts import load_facts

    facts = load_facts(config.data, config.n_edits)
    return {"n_edits": len(facts), "layers": config.layers or "default ([3,4] with >= 8 blocks)",
            "batch_size": config.batch_size or len(facts), "stats_dir": str(stats_dir(config.stats_dir))}
