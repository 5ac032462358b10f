"""Passthrough (mergekit's `slices`): stack block ranges of models into a new, possibly deeper model.

Output block j of the slice that holds it is block `layer_range[0] + k` of that slice's model (k = j's offset in
the slice), optionally scaled by `scale` read at t = k / (slice length − 1) (1 for a one-block slice); the tensors
outside the blocks come from the first slice's model (embeddings) and the last slice's (final norm, head), scaled
at t = 0, as mergekit plans them. Streamed from safetensors directories, one tensor at a time."""

from __future__ import annotations

from toolkit.core.registry import register
from toolkit.merge.config import PassthroughConfig


def plan(config: PassthroughConfig, names_of: dict[str, list[str]], blocks_of: dict[str, int]):
    """[(output name, source model, source name, t, scale setting)] in output order."""
    from toolkit.core.errors import require
    from toolkit.merge.common import LAYER

    def block_name(name: str, index: int) -> str:
        match = LAYER.search(name)
        return name[:match.start(1)] + str(index) + name[match.end(1):]

    first, last = config.slices[0].sources[0], config.slices[-1].sources[0]
    outside = [n for n in names_of[first.model] if not LAYER.search(n)]
    entries, out_block = [], 0
    for source in (s.sources[0] for s in config.slices):
        start, stop = source.layer_range
        require(0 <= start < stop <= blocks_of[source.model], f"layer_range {[start, stop]} is outside the "
                f"{blocks_of[source.model]} blocks of {source.model}")
        length = stop - start
        for k in range(length):
            t = k / (length - 1) if length > 1 else 1.0
            for name in names_of[source.model]:
                match = LAYER.search(name)
                if match and int(match.group(1)) == start + k:
                    entries.append((block_name(name, out_block), source.model, name, t, source.scale))
            out_block += 1
    head = [(n, first.model, n, 0.0, first.scale) for n in outside if not _is_post(n)]
    tail = [(n, last.model, n, 0.0, last.scale) for n in outside if _is_post(n)]
    return head + entries + tail, out_block


def _is_post(name: str) -> bool:
    """Final norm and head: what comes after the blocks."""
    return name.startswith(("lm_head", "model.norm", "transformer.ln_f", "norm.")) or ".final_layer_norm" in name


@register("merge", "passthrough", config=PassthroughConfig, tensorwise=False, mergekit="passthrough",
          mergekit_slices=True, paper="", flags=[],
          help="Stack block ranges of models (slices with layer_range, via --config YAML or a mergekit config).",
          epilog="Examples: iclrkit merge passthrough --config frankenmerge.yaml -o merged | "
                 "iclrkit merge mergekit passthrough.yml -o merged")
def passthrough(config: PassthroughConfig, ctx) -> None:
    from toolkit.core.errors import require
    from toolkit.merge.common import (
        DTYPES,
        LAYER,
        Site,
        compute_dtype,
        numerics_note,
        read_finite,
        streamable,
        write_card,
        write_streamed,
    )
    from toolkit.models.lazy import SafetensorsIndex

    models = config.models
    require(streamable(models), "passthrough reads local safetensors model directories",
            hint="save each model with save_pretrained first")
    indexes = {m: SafetensorsIndex(m) for m in models}
    names_of = {m: i.names() for m, i in indexes.items()}
    entries, blocks = plan(config, names_of, {m: _blocks(names_of[m], LAYER) for m in models})
    template = indexes[models[0]]
    out_dtype = template.dtype if config.dtype == "auto" else DTYPES[config.dtype]
    work = compute_dtype(config, out_dtype)

    def tensor(entry):
        out_name, model, name, t, scale = entry
        value = read_finite(indexes[model], name)
        if not value.is_floating_point():
            return out_name, value
        value = value.to(work)
        factor = Site(name, t, ctx.seed).at(scale)
        return out_name, (value if factor is None else value * factor).to(out_dtype)

    layout = [(o, out_dtype if indexes[m].dtype_of[n].is_floating_point else indexes[m].dtype_of[n],
               indexes[m].shape_of[n]) for o, m, n, _, _ in entries]
    out = ctx.path("model")
    total = write_streamed(out, layout, map(tensor, entries), None)
    write_card(out, template.directory, models, "merge.passthrough", "", {"blocks": blocks}, out_dtype,
               "Passthrough merge (slices of blocks). " + numerics_note(config))
    _set_depth(out / "config.json", blocks)
    ctx.metrics.update({"n_models": len(models), "blocks": blocks, "streamed": True,
                        "dtype": str(out_dtype).removeprefix("torch."), "bytes_written": total})


def _blocks(names: list[str], layer) -> int:
    return 1 + max((int(x.group(1)) for n in names if (x := layer.search(n))), default=-1)


def _set_depth(path, blocks: int) -> None:
    """The output config.json says the new number of blocks."""
    import json

    written = json.loads(path.read_text())
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in written:
            written[key] = blocks
    path.write_text(json.dumps(written, indent=2, sort_keys=True))
