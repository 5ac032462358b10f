"""Writing safetensors shards as a run produces tensors (`ShardWriter`: each tensor straight into its planned shard,
header first, nothing pending in memory; a failed run removes what it wrote) and copying a model directory's
non-weight files beside them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from toolkit.models.lazy import _DTYPES, INDEX, SINGLE, _bytes_of, _numel

_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class ShardWriter:
    """Write tensors straight into `model-0000k-of-0000N.safetensors` shards as they come: the layout (names,
    dtypes, shapes, in writing order) is known up front, so each shard's header is written first and every tensor
    is appended the moment it is given; nothing is held back. `close()` names the shards and writes the index."""

    def __init__(self, directory, layout: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 max_shard_bytes: int = 2 * 10**9):
        self.directory = Path(directory)
        self.layout = [(name, dtype, tuple(shape)) for name, dtype, shape in layout]
        self.shards: list[list[int]] = [[]]
        size = 0
        for position, (_, dtype, shape) in enumerate(self.layout):
            nbytes = _numel(shape) * _bytes_of(dtype)
            if self.shards[-1] and size + nbytes > max_shard_bytes:
                self.shards.append([])
                size = 0
            self.shards[-1].append(position)
            size += nbytes
        self.total_bytes = sum(_numel(s) * _bytes_of(d) for _, d, s in self.layout)
        self.next = 0
        self.shard = -1
        self.handle = None

    def _temporary(self, number: int) -> Path:
        return self.directory / f".shard-{number:05d}.tmp"

    def _open_next_shard(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.shard += 1
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for position in self.shards[self.shard]:
            name, dtype, shape = self.layout[position]
            nbytes = _numel(shape) * _bytes_of(dtype)
            header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.handle = open(self._temporary(self.shard), "wb")
        self.handle.write(struct.pack("<Q", len(raw)))
        self.handle.write(raw)

    def add(self, tensors: dict[str, torch.Tensor]) -> None:
        from toolkit.core.errors import RunError

        for name, tensor in tensors.items():
            if self.next >= len(self.layout):
                raise RunError(f"writer got '{name}' after the last planned tensor")
            want, dtype, shape = self.layout[self.next]
            if name != want or tensor.dtype != dtype or tuple(tensor.shape) != shape:
                raise RunError(f"writer expected '{want}' {dtype} {shape}, got '{name}' {tensor.dtype} "
                               f"{tuple(tensor.shape)}")
            if self.shard < 0 or self.next not in self.shards[self.shard]:
                self._open_next_shard()
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            self.handle.write(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
            self.next += 1

    def abort(self) -> None:
        """Remove what was written (a failed run leaves no half model)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        for number in range(len(self.shards)):
            self._temporary(number).unlink(missing_ok=True)

    def close(self) -> dict:
        """Name the shards, write the index (or a single `model.safetensors`); returns the index."""
        from toolkit.core.errors import RunError

        if self.next != len(self.layout):
            self.abort()
            raise RunError(f"writer got {self.next} of {len(self.layout)} planned tensors")
        if not self.layout:
            raise RunError("nothing to write")
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        total = len(self.shards)
        weight_map = {}
        for number, positions in enumerate(self.shards):
            final = SINGLE if total == 1 else f"model-{number + 1:05d}-of-{total:05d}.safetensors"
            self._temporary(number).replace(self.directory / final)
            weight_map.update({self.layout[p][0]: final for p in positions})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        if total > 1:
            (self.directory / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
        return index


MODEL_FILES_SKIPPED = (INDEX, SINGLE, "README.md")


def copy_model_files(source, target, config_extra: dict | None = None, dtype: torch.dtype | None = None) -> None:
    """Copy config, generation config and tokenizer files (everything but the weights and the card) from a model
    directory; `config_extra` keys are added to the copied config.json, and its dtype entry set to `dtype`."""
    import shutil

    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if not path.is_file() or path.name in MODEL_FILES_SKIPPED or path.suffix == ".safetensors" \
                or path.name.startswith("."):
            continue
        shutil.copyfile(path, target / path.name)
    if config_extra or dtype is not None:
        config = json.loads((target / "config.json").read_text())
        config.update(config_extra or {})
        for key in ("dtype", "torch_dtype"):
            if dtype is not None and key in config:
                config[key] = str(dtype).removeprefix("torch.")
        (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
