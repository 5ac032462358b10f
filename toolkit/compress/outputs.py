"""What a compress run writes: the resident run's exports (packed INT4 + bitmask, dense fake-quant HF model,
compressed-tensors, gguf) and the onloaded run's dense model, finished after its blocks were written one by one."""

from __future__ import annotations

import logging

log = logging.getLogger("iclrkit")


def export_outputs(view, tokenizer, config, ctx, scales, rotation, vocab_grids, g_idx=None) -> None:
    """Writes what a resident compress run produced under ctx.out, as `config.export` asks: packed INT4 (+ model
    card), the dense fake-quant HF model (online rotations folded), compressed-tensors / gguf; records fp16_mb and
    the packed sizes in ctx.metrics."""
    from toolkit.compress.packed import fp16_size_bytes, save_packed

    model = view.model
    ctx.metrics["fp16_mb"] = round(fp16_size_bytes(model) / 1e6, 3)
    if ctx.out is None or config.export == "none":
        return
    metadata = {"method": config.method, "w_bits": config.w_bits, "a_bits": config.a_bits,
                "kv_bits": config.kv_bits, "sparsity": config.sparsity, "nm": config.nm, "rotation": rotation,
                "embed_bits": config.embed_bits, "group_size": config.group_size,
                "actorder": getattr(config, "actorder", "none"), "a_clip_ratio": config.a_clip_ratio,
                "kv_quant": config.kv_quant}
    if getattr(config, "stages", None):  # a recipe: its resolved stages, in order (the cards list them)
        metadata["stages"] = config.stages
    if config.export in ("compressed-tensors", "gguf"):
        from toolkit.export.run import export_compress_run

        export_compress_run(config, ctx, view, tokenizer, scales, metadata, g_idx)
    if config.export in ("both", "packed", "compressed-tensors", "gguf"):
        if config.w_bits >= 16:
            log.warning("packed export skipped: weights are not quantized (w_bits=16)")
        else:
            sizes = save_packed(view, tokenizer, ctx.path("packed"), scales, config.w_bits, metadata,
                                config.embed_bits, config.embed_group, vocab_grids, g_idx)
            ctx.metrics.update(sizes)
            from toolkit.export.card import write_packed_card

            write_packed_card(ctx.path("packed"), metadata, config.w_bits,
                              {"source_model": config.model, "calibration": f"{config.data} ({config.nsamples} "
                               f"windows x {config.seqlen} tokens)" if config.data else "none"}, sizes)
    if config.export in ("both", "dense"):
        from toolkit.compress.rotation import fold_online_rotations
        from toolkit.export.card import command_line, dense_card_notes
        from toolkit.models.save import save_model

        fold_online_rotations(view)
        save_model(model, tokenizer, ctx.path("model"), technique=f"compress.{config.method}", source=config.model,
                   paper="https://arxiv.org/abs/2509.11177", command=command_line(),
                   notes="Dense fake-quant export: weights hold the quantized (and pruned) values in float; the "
                         "rotation is folded in, activation/KV quantization is not representable here.\n\n"
                         + dense_card_notes(config, metadata),
                   metadata=metadata)


def finish_onloaded_export(config, source, out_dir, dtype) -> None:
    """onload=true: the blocks are already in out_dir; add the model's other files (config with the technique
    metadata, tokenizer, ...) and the model card."""
    from toolkit.export.card import recipe_lines
    from toolkit.models.save import CARD
    from toolkit.models.shards import copy_model_files

    metadata = {"method": config.method, "w_bits": config.w_bits, "a_bits": config.a_bits,
                "kv_bits": config.kv_bits, "sparsity": config.sparsity, "nm": config.nm, "rotation": None,
                "embed_bits": 16, "onload": True}
    if getattr(config, "stages", None):
        metadata["stages"] = config.stages
    copy_model_files(source, out_dir, {"iclrkit": metadata}, dtype=dtype)
    (out_dir / "README.md").write_text(CARD.format(
        title=f"compress.{config.method}: {source.name}", technique=f"compress.{config.method}",
        source=config.model, paper="https://arxiv.org/abs/2509.11177", command="-",
        notes="Dense fake-quant export written block by block (onload=true): weights hold the quantized (and "
              "pruned) values in float; unrotated."
              + "".join(f"\n\n{line}" for line in recipe_lines(metadata))))
