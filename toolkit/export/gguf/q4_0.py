"""The Q4_0 block format both ways: codes and per-block fp16 scales to llama.cpp's 18-byte blocks, and a written file
read back (codes and scales, or dequantized weights) for checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.core.errors import BadInputError

BLOCK = 32
ROUNDING = ("Q4_0 mapping: every 32-column block of a row gets d = fp16(row scale) (round to nearest even), codes "
            "unchanged; each weight moves by at most 2^-11 of its value and pruned weights stay exactly 0.")


def q4_0_bytes(codes: np.ndarray, block_scales: np.ndarray) -> np.ndarray:
    """codes int [rows, cols] in [−8, 7], block_scales [rows, cols/32] → uint8 [rows, cols/32·18] Q4_0 blocks."""
    rows, cols = codes.shape
    blocks = cols // BLOCK
    q = (codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, blocks, BLOCK)
    qs = q[..., :16] | (q[..., 16:] << 4)
    d = block_scales.astype(np.float16).reshape(rows, blocks, 1).view(np.uint8)
    return np.concatenate([d, qs], axis=-1).reshape(rows, blocks * 18)


def grid_block_scales(grid) -> np.ndarray:
    """A grid's scales (per channel, or per group of a multiple of 32 columns) as one scale per 32-column block."""
    cols = grid.codes.shape[1]
    scales = grid.scales.float().numpy()
    if grid.group_size is None:
        return np.repeat(scales, cols // BLOCK, axis=1)
    return np.repeat(scales, grid.group_size // BLOCK, axis=1)[:, :cols // BLOCK]


def fp16_scales(path: str, scales: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Block scales as fp16, or one BadInputError line where a scale in use underflows or overflows."""
    half = scales.astype(np.float16)
    used = np.abs(codes.reshape(*scales.shape, -1)).max(-1) > 0
    if not np.isfinite(half).all() or (used & (half == 0)).any():
        raise BadInputError(f"{path}: a weight scale does not fit fp16 (Q4_0 stores fp16 block scales)")
    return half


def read_q4_0(path: Path) -> tuple[dict, dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """A GGUF file as written: (metadata {key: value}, {name: (codes int8 [..., cols] in [−8, 7], d float16
    [..., cols/32])} for Q4_0 tensors, {name: float32 array} for the others), shapes in (rows, cols) order."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        metadata[key] = value
    grids, floats = {}, {}
    for t in reader.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_0:
            raw = np.asarray(t.data, dtype=np.uint8).reshape(*shape[:-1], shape[-1] // BLOCK, 18)
            d = raw[..., :2].copy().view(np.float16)[..., 0]
            qs = raw[..., 2:]
            codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8
            grids[t.name] = (codes.reshape(shape), d)
        else:
            floats[t.name] = np.asarray(t.data, dtype=np.float32).reshape(shape)
    return metadata, grids, floats


def read_gguf_weights(path: Path) -> dict[str, np.ndarray]:
    """{gguf tensor name: dequantized float32 array in (rows, cols) order} via gguf.GGUFReader (for checks)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
        tuple(int(s) for s in reversed(t.shape))) for t in reader.tensors}
