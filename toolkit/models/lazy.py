"""A model read lazily from a local safetensors directory (`model.safetensors`, or the shards a sharded
`model.safetensors.index.json` names, as transformers writes them).

`SafetensorsIndex` checks the files before anything is read or written (every shard the index names exists, no
shard is truncated, the floating tensors of all shards share one dtype) and reads one tensor at a time.
`LazyModel` builds the model skeleton with its parameters on the meta device (no memory), materialises the parts
outside the decoder blocks (embeddings, final norm, head) and each block only when asked, and frees a block
afterwards: peak memory is the non-block parts plus the blocks that are loaded.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
import torch.nn as nn

from toolkit.core.errors import BadInputError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def is_safetensors_dir(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and ((path / INDEX).is_file()
                                                                   or (path / SINGLE).is_file())


def onload_source(model: str) -> Path:
    """The local safetensors directory that per-block onloading (onload=true) reads `model` from; anything else
    (a hub id not in the cache, a .bin or GGUF checkpoint) is refused with one line."""
    from toolkit.models.source import resolve_model_path

    source = resolve_model_path(model)
    if not is_safetensors_dir(source):
        raise BadInputError(f"onload=true needs a local model directory of safetensors files, got {model}",
                            "save the model with save_pretrained first, or drop onload=true")
    return Path(source)


def read_header(path: Path) -> dict:
    """The JSON header of one safetensors file, checked against the file size (a truncated file is refused)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            raw = handle.read(8)
            if len(raw) < 8:
                raise BadInputError(f"{path} is truncated (no safetensors header)")
            (length,) = struct.unpack("<Q", raw)
            if length > size - 8:
                raise BadInputError(f"{path} is truncated (header runs past the end of the file)")
            header = json.loads(handle.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{path} is not a readable safetensors file: {exc}") from None
    header.pop("__metadata__", None)
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if 8 + length + end > size:
        raise BadInputError(f"{path} is truncated: its header needs {8 + length + end} bytes, the file has {size}")
    return header


class SafetensorsIndex:
    """Tensor name → shard file, dtypes and shapes, for a local safetensors directory; checked on construction."""

    def __init__(self, directory):
        self.directory = Path(directory)
        index_file, single = self.directory / INDEX, self.directory / SINGLE
        if index_file.is_file():
            try:
                weight_map = json.loads(index_file.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise BadInputError(f"{index_file} is malformed: {exc}") from None
            shards = sorted(set(weight_map.values()))
            missing = [s for s in shards if not (self.directory / s).is_file()]
            if missing:
                raise BadInputError(f"{index_file} names {len(missing)} shard(s) that are missing: "
                                    f"{', '.join(missing[:3])}")
        elif single.is_file():
            weight_map, shards = None, [SINGLE]
        else:
            raise BadInputError(f"{self.directory} has neither {INDEX} nor {SINGLE}")
        self.shard_of: dict[str, str] = {}
        self.dtype_of: dict[str, torch.dtype] = {}
        self.shape_of: dict[str, tuple[int, ...]] = {}
        float_dtypes: dict[torch.dtype, str] = {}  # each shard's main float dtype (by bytes) -> first such shard
        for shard in shards:
            header = read_header(self.directory / shard)
            sizes: dict[torch.dtype, int] = {}
            for name, info in header.items():
                if info["dtype"] not in _DTYPES:
                    raise BadInputError(f"{shard}: tensor '{name}' has unsupported dtype {info['dtype']}")
                dtype = _DTYPES[info["dtype"]]
                self.shard_of[name], self.dtype_of[name] = shard, dtype
                self.shape_of[name] = tuple(info["shape"])
                if dtype.is_floating_point:
                    sizes[dtype] = sizes.get(dtype, 0) + _numel(info["shape"]) * _bytes_of(dtype)
            if sizes:
                float_dtypes.setdefault(max(sizes, key=sizes.get), shard)
        if len(float_dtypes) > 1:
            found = ", ".join(f"{str(d).removeprefix('torch.')} ({s})" for d, s in float_dtypes.items())
            raise BadInputError(f"{self.directory}: shards disagree on the weight dtype: {found}")
        if weight_map is not None:
            absent = [n for n, s in weight_map.items() if self.shard_of.get(n) != s]
            if absent:
                raise BadInputError(f"{index_file} maps {len(absent)} tensor(s) to shards that do not hold them, "
                                    f"e.g. '{absent[0]}'")
        self.dtype = next(iter(float_dtypes), torch.float32)

    def names(self) -> list[str]:
        return list(self.shard_of)

    def nbytes(self, name: str) -> int:
        return _numel(self.shape_of[name]) * _bytes_of(self.dtype_of[name])

    def get_rows(self, name: str, start: int, stop: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Rows start:stop of a tensor (its first dimension), read without the rest."""
        from safetensors import safe_open

        with safe_open(str(self.directory / self.shard_of[name]), framework="pt") as handle:
            tensor = handle.get_slice(name)[start:stop]
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        return tensor

    def get(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, read from its shard (a fresh CPU tensor), optionally cast to `dtype`."""
        from safetensors import safe_open

        if name not in self.shard_of:
            raise BadInputError(f"{self.directory}: no tensor '{name}' in the checkpoint")
        shard = self.shard_of[name]
        with safe_open(str(self.directory / shard), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        return tensor


class LazyModel:
    """The model skeleton with meta parameters; `load_non_block()` and `load_block(i)` / `free_block(i)` put real
    tensors (read from the checkpoint, cast to `dtype`) in and take them out again."""

    def __init__(self, directory, dtype: torch.dtype = torch.float32):
        import transformers
        from accelerate import init_empty_weights

        from toolkit.models.source import _quiet_transformers
        from toolkit.models.view import view_of

        self.directory = Path(directory)
        if not (self.directory / "config.json").is_file():
            raise BadInputError(f"model directory {self.directory} has no config.json")
        self.index = SafetensorsIndex(self.directory)
        _quiet_transformers()
        try:
            self.config = transformers.AutoConfig.from_pretrained(str(self.directory), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise BadInputError(f"could not read {self.directory}/config.json: {str(exc).splitlines()[0]}") from None
        self.dtype = dtype
        with init_empty_weights(include_buffers=False):
            self.model = transformers.AutoModelForCausalLM.from_config(self.config, dtype=dtype)
        self.model.eval()
        self.view = view_of(self.model)
        self.layers = self.view.blocks
        self.prefix = self.view.layers_path
        self.tied = _tied_aliases(self.model, self.index)
        names = {n for n, _ in self.model.named_parameters(remove_duplicate=False)}
        names |= {n for n, _ in _persistent_buffers(self.model)}
        wanted = names - set(self.tied)
        self.parts = {name: self._parts_of(name) for name in wanted}  # in-memory name → checkpoint tensors
        absent = sorted(n for n in wanted if self.parts[n] is None)
        if absent:
            raise BadInputError(f"{self.directory}: the checkpoint lacks {len(absent)} tensor(s) the "
                                f"{self.config.model_type} config needs, e.g. '{absent[0]}'")

    # -- checkpoint names ----------------------------------------------------------------------------------------------
    def _parts_of(self, name: str):
        """How in-memory tensor `name` is stored: [(checkpoint name, expert or None, rows or None)], or None when the
        checkpoint lacks it. Names usually match; transformers 5 renames some modules (Mixtral's block_sparse_moe →
        mlp) and stacks per-expert checkpoint tensors into fused ones (experts.gate_up_proj [E, 2I, H])."""
        from toolkit.models.experts import disk_name, expert_disk_names

        if name in self.index.shard_of:
            return [(name, None, None)]
        model_type = self.config.model_type
        renamed = disk_name(model_type, name)
        if renamed in self.index.shard_of:
            return [(renamed, None, None)]
        tensor = _get_tensor(self.model, name)
        if tensor.dim() != 3:
            return None
        try:
            parts = [(f"{disk}.weight", expert, rows) for expert in range(tensor.shape[0])
                     for disk, rows in expert_disk_names(model_type, name, expert, tensor.shape[1])]
        except BadInputError:
            return None
        return parts if all(disk in self.index.shard_of for disk, _, _ in parts) else None

    def read(self, name: str) -> torch.Tensor:
        """In-memory tensor `name` read from the checkpoint in the compute dtype (fused experts assembled)."""
        parts = self.parts[name]
        if parts[0][1] is None:
            return self.index.get(parts[0][0], self.dtype)
        experts: dict[int, list[torch.Tensor]] = {}
        for disk, expert, _ in parts:
            experts.setdefault(expert, []).append(self.index.get(disk, self.dtype))
        return torch.stack([torch.cat(experts[e]) for e in sorted(experts)])

    def _written(self, name: str, tensor: torch.Tensor | None = None) -> list[tuple[str, torch.Tensor | None]]:
        """(checkpoint name, tensor or None) pairs `name` is written as: the checkpoint's own layout."""
        parts = self.parts[name]
        if parts[0][1] is None:
            return [(parts[0][0], tensor)]
        return [(disk, None if tensor is None else tensor[expert, rows].contiguous()) for disk, expert, rows in parts]

    # -- parts outside the blocks -----------------------------------------------------------------------------------
    def block_prefix(self, index: int) -> str:
        return f"{self.prefix}.{index}."

    def non_block_names(self) -> list[str]:
        return [n for n in self._tensor_names(self.model) if not n.startswith(self.prefix + ".")]

    def load_non_block(self) -> None:
        for name in self.non_block_names():
            _set_tensor(self.model, name, self.read(name))
        for alias, source in self.tied.items():
            _alias_parameter(self.model, alias, source)

    # -- one block at a time ----------------------------------------------------------------------------------------
    def block_names(self, index: int) -> list[str]:
        """The block's tensor names relative to the block (as its state_dict names them)."""
        return self._tensor_names(self.layers[index])

    def load_block(self, index: int) -> nn.Module:
        block = self.layers[index]
        prefix = self.block_prefix(index)
        for name in self.block_names(index):
            _set_tensor(block, name, self.read(prefix + name))
        return block

    def free_block(self, index: int) -> None:
        block = self.layers[index]
        for name in self.block_names(index):
            owner, leaf = _owner(block, name)
            current = getattr(owner, leaf)
            _set_tensor(block, name, torch.empty(current.shape, dtype=current.dtype, device="meta"))

    def block_state(self, index: int) -> dict[str, torch.Tensor]:
        """The loaded block's tensors under their checkpoint names."""
        block, prefix = self.layers[index], self.block_prefix(index)
        return {disk: value for n in self.block_names(index)
                for disk, value in self._written(prefix + n, _get_tensor(block, n).detach())}

    def non_block_state(self) -> dict[str, torch.Tensor]:
        return {disk: value for n in self.non_block_names()
                for disk, value in self._written(n, _get_tensor(self.model, n).detach())}

    def output_layout(self, save_dtype: torch.dtype | None = None) -> list[tuple[str, torch.dtype, tuple]]:
        """(name, dtype, shape) of every tensor the onloaded pipeline writes, in its order: blocks, then the rest."""
        names = [self.block_prefix(i) + n for i in range(len(self.layers)) for n in self.block_names(i)]
        names += self.non_block_names()
        names = [disk for name in names for disk, _ in self._written(name)]
        layout = []
        for name in names:
            stored = self.index.dtype_of[name]
            layout.append((name, (save_dtype or self.dtype) if stored.is_floating_point else stored,
                           self.index.shape_of[name]))
        return layout

    def _tensor_names(self, root: nn.Module) -> list[str]:
        names = [n for n, _ in root.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in _persistent_buffers(root)]
        if root is self.model:
            names = [n for n in names if n not in self.tied]
        return [n for n in names if _in_checkpoint(self, root, n)]


def _in_checkpoint(lazy: LazyModel, root: nn.Module, name: str) -> bool:
    if root is lazy.model:
        return lazy.parts.get(name) is not None
    return True


def _persistent_buffers(root: nn.Module):
    for module_name, module in root.named_modules(remove_duplicate=False):
        skip = getattr(module, "_non_persistent_buffers_set", set())
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in skip:
                yield (f"{module_name}.{name}" if module_name else name), buffer


def _tied_aliases(model: nn.Module, index: SafetensorsIndex) -> dict[str, str]:
    """Parameters tied to another (GPT-2/Llama lm_head → embeddings) that the checkpoint leaves out."""
    keys = getattr(model, "_tied_weights_keys", None) or {}
    if not isinstance(keys, dict) or not getattr(model.config, "tie_word_embeddings", False):
        return {}
    return {alias: source for alias, source in keys.items() if alias not in index.shard_of}


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (root.get_submodule(path) if path else root), leaf


def _get_tensor(root: nn.Module, name: str) -> torch.Tensor:
    owner, leaf = _owner(root, name)
    return getattr(owner, leaf)


def _set_tensor(root: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, leaf = _owner(root, name)
    if leaf in owner._parameters:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


def _alias_parameter(root: nn.Module, alias: str, source: str) -> None:
    owner, leaf = _owner(root, alias)
    owner._parameters[leaf] = _get_tensor(root, source)


def _numel(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _bytes_of(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
