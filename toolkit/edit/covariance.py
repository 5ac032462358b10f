"""Context templates (random generated prefixes) and the key covariance C = E[k kᵀ] over text, streamed, chunked and
cached under a model/text fingerprint.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

import torch

from toolkit.core.errors import RunError
from toolkit.edit.context import EditContext

log = logging.getLogger("iclrkit.edit")
BATCH = 8  # windows per forward of the covariance pass
PREFIX_SEEDS = ("The", "Therefore", "Because", "I", "You", "However", "Also", "Nevertheless", "He", "It", "Can",
                "Because")


@torch.no_grad()
def context_templates(ectx: EditContext, n: int, length: int) -> list[str]:
    """"" (the bare prompt) plus n model-generated prefixes ending in ". " (the paper's random-prefix prompts)."""
    model, tokenizer = ectx.model, ectx.tokenizer
    if n <= 0:
        return [""]
    seeds = [PREFIX_SEEDS[i % len(PREFIX_SEEDS)] for i in range(n)]
    templates = [""]
    for seed in seeds:
        ids = torch.tensor([tokenizer(seed)["input_ids"]], device=ectx.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=length, do_sample=True,
                             top_k=100, temperature=0.5, pad_token_id=ectx.pad)
        text = tokenizer.decode(out[0], skip_special_tokens=True).replace("{", " ").replace("}", " ")
        templates.append(" ".join(text.split()) + ". ")
    return templates


def model_fingerprint(model) -> str:
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, param in model.named_parameters():
            _update(digest, name, param)
    return digest.hexdigest()[:16]


def checkpoint_fingerprint(lazy, device: str = "cpu") -> str:
    """model_fingerprint of the model a resident load of `lazy`'s checkpoint on `device` gives (same dtype), read
    one tensor at a time: the onloaded covariance shares the resident path's cache files."""
    from toolkit.nn.onload_stats import checkpoint_fingerprint as feed

    digest = hashlib.sha256(lazy.model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        feed(lazy, _update, digest, device)
    return digest.hexdigest()[:16]


def _update(digest, name: str, tensor: torch.Tensor) -> None:
    p = tensor.detach().double()
    digest.update(f"{name}:{p.sum().item():.10e}:{p.square().sum().item():.10e}".encode())


def stats_dir(configured: str | None) -> Path:
    if configured:
        return Path(configured).expanduser()
    root = os.environ.get("ICLRKIT_CACHE_DIR", Path.home() / ".cache" / "iclrkit")
    return Path(root).expanduser() / "edit-stats"


def _cached(fingerprint: str, layers: list[int], text: str, n_tokens: int, seqlen: int, cache: Path):
    """({layer: cache file}, {layer: covariance already cached}, layers still to compute)."""
    text_sha = hashlib.sha256(text.encode()).hexdigest()[:16]
    base = f"{fingerprint}-{text_sha}-{n_tokens}-{seqlen}"
    files = {l: cache / f"cov-{base}-layer{l}.pt" for l in layers}
    covs = {l: _load_cached(f) for l, f in files.items() if f.is_file()}
    return files, covs, [l for l in layers if l not in covs]


def _load_cached(file: Path):
    """A cached covariance; a truncated or hostile file is one line naming it (exit 2), never torch's message."""
    from toolkit.core.errors import corrupt_file

    try:
        return torch.load(file, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a damaged file
        raise corrupt_file(file, exc, "cached covariance", "delete it: it is recomputed") from None


def _windows(tokenizer, text: str, n_tokens: int, seqlen: int) -> torch.Tensor:
    from toolkit.data.text import calibration_windows

    return calibration_windows(tokenizer, text, max(1, -(-n_tokens // seqlen)), seqlen, seed=0)


def _recorder(accumulators: dict, layer: int, stop: bool = False):
    """A forward hook adding the down-projection's input to layer's HessianAccumulator (made at the first input);
    `stop` ends the forward after it (the last layer needed)."""
    from toolkit.linalg.hessian import HessianAccumulator
    from toolkit.nn.hooks import StopForward

    def record(module, args, output):
        x = args[0].detach()
        if layer not in accumulators:
            accumulators[layer] = HessianAccumulator(x.shape[-1], device=x.device)
        accumulators[layer].add(x)
        if stop:
            raise StopForward
    return record


def _store(accumulators: dict, files: dict, covs: dict, todo: list[int], cache: Path) -> dict[int, torch.Tensor]:
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


@torch.no_grad()
def key_covariance(ectx: EditContext, layers: list[int], text: str, n_tokens: int, seqlen: int,
                   cache: Path) -> dict[int, torch.Tensor]:
    """C_l = E[k kᵀ] of the down-projection inputs over n_tokens of text (fp64 accumulation, fp32 result),
    cached on disk under a fingerprint of the model, the text, the layer and the sample size."""
    from toolkit.linalg.hessian import HessianAccumulator
    from toolkit.nn.hooks import StopForward, module_at

    model, progress = ectx.model, ectx.progress
    files, covs, todo = _cached(model_fingerprint(model), layers, text, n_tokens, seqlen, cache)
    if not todo:
        return covs
    windows = _windows(ectx.tokenizer, text, n_tokens, seqlen)
    accumulators: dict[int, HessianAccumulator] = {}
    handles = []

    try:
        for layer in todo:
            handles.append(module_at(model, ectx.down(layer)).register_forward_hook(
                _recorder(accumulators, layer, stop=layer == todo[-1])))
        batches = range(0, len(windows), BATCH)
        for start in (progress(batches, description="covariance") if progress else batches):
            with contextlib.suppress(StopForward):
                model(input_ids=windows[start:start + BATCH].to(ectx.device))
    finally:
        for handle in handles:
            handle.remove()
    return _store(accumulators, files, covs, todo, cache)


@torch.no_grad()
def key_covariance_onloaded(lazy, tokenizer, layers: list[int], text: str, n_tokens: int, seqlen: int, cache: Path,
                            device: str = "cpu", progress=None, probe=None) -> dict[int, torch.Tensor]:
    """key_covariance of a `toolkit.models.lazy.LazyModel` (edit --set onload=true), block by block: the embeddings
    once, then blocks 0..max(layers) read from the shards one at a time, the down-projection input hooked at each
    edit layer, each block freed. The same windows, batches and accumulation as the resident path, and the same
    cache files (the fingerprint is read from the checkpoint one tensor at a time). Memory: the parts outside the
    blocks + one block + every window's hidden states + the covariances."""
    from toolkit.linalg.hessian import HessianAccumulator
    from toolkit.nn.onload_stats import BlockStream

    files, covs, todo = _cached(checkpoint_fingerprint(lazy, device), layers, text, n_tokens, seqlen, cache)
    if not todo:
        return covs
    windows = _windows(tokenizer, text, n_tokens, seqlen)
    stream = BlockStream(lazy, device, probe)
    accumulators: dict[int, HessianAccumulator] = {}

    def hooks(index, block):
        if index not in todo:
            return []
        target = lazy.view.mlp_out(index, "MEMIT's covariance").module
        return [block.get_submodule(target).register_forward_hook(_recorder(accumulators, index))]

    stream.run([stream.windows(windows, batch=BATCH)], last=max(todo), hooks=hooks,
               stop_inside_last=lambda index: lazy.view.mlp_out(index).module, progress=progress)
    return _store(accumulators, files, covs, todo, cache)
