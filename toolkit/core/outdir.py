"""--out: everything about it that can be checked before a run (check_out_dir), and its atomic writing
(atomic_dir: OUT.partial, renamed at the end; what a failed run keeps for --resume)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from toolkit.core.errors import BadInputError

log = logging.getLogger("iclrkit")
CHECKPOINTS = "checkpoints"


def protected_dirs() -> list[Path]:
    """Caches that --out must never point into or contain: the zoo, iclrkit's own cache and the Hugging Face cache."""
    from toolkit.core.paths import caches

    return [d.expanduser().resolve() for d in caches().values()]


def input_location(item: str | Path) -> Path | None:
    """Where an input lives on disk: a path, zoo:NAME's cache directory, or a hub id's HF cache folder."""
    text = str(item)
    if text.startswith("zoo:"):
        from toolkit.core.paths import zoo_cached_path

        return zoo_cached_path(text[4:])
    path = Path(text).expanduser()
    if path.exists():
        return path
    parts = text.split("/")
    if 1 <= len(parts) <= 2 and all(parts) and not text.startswith((".", "~")):
        try:
            from huggingface_hub import constants

            return Path(constants.HF_HUB_CACHE) / ("models--" + "--".join(parts))
        except Exception:  # noqa: BLE001
            return None
    return None


def is_iclrkit_output(path: Path) -> bool:
    return (path / "run.json").is_file()


def _home_of(src: Path) -> Path | None:
    """The directory that belongs to an input: a directory itself, or the folder holding a file (a data file may name
    its siblings: images, shards, a second split), so --out goes into neither. The working directory and the folders
    above it are where a command's outputs normally go (`-d valid.txt -o runs/x`): a file there claims no folder."""
    if not src.is_file():
        return src
    cwd = Path.cwd().resolve()
    return None if src.parent == cwd or src.parent in cwd.parents else src.parent


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(out: Path, overwrite: bool, inputs: Iterable[str | Path] = (), force: bool = False,
                  files: Iterable[str | Path] = ()) -> None:
    """Everything about --out that can be known before the run, each refused with one line (exit 2):
    an existing file; a cache (zoo, iclrkit, Hugging Face) it is inside or contains; an input it equals, contains, or
    is inside the directory of (a model or data directory, the folder holding a model or data file); a location
    where OUT.partial cannot be written; a mount point; a non-empty directory without --overwrite, and one that is not
    an iclrkit output (no run.json) without --overwrite --force. (A file in the working directory or above it claims
    no folder: `-d valid.txt -o runs/x` is fine.) Symlinks are followed: --out is judged by its
    target. An existing empty directory is fine (the run replaces it). `files` (configuration files such as a
    mergekit YAML) are protected themselves, not their folder."""
    given = Path(out).expanduser()
    out = given.resolve()
    if out.exists() and not out.is_dir():
        raise BadInputError(f"--out {given} is an existing file, not a directory", "choose a directory path")
    _refuse_caches(out, given)
    _refuse_inputs(out, given, inputs, files)
    _refuse_location(out, given)
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise BadInputError(f"--out {given} exists and is not empty", "pass --overwrite or choose another directory")
    if not is_iclrkit_output(out) and not force:
        raise BadInputError(f"--out {given} is not an iclrkit output (no run.json); --overwrite would delete it",
                            "pass --overwrite --force to replace it anyway, or choose another directory")


def _refuse_caches(out: Path, given: Path) -> None:
    from toolkit.core.paths import caches

    for name, cache in caches().items():
        cache = cache.expanduser().resolve()
        if out == cache or cache in out.parents:
            raise BadInputError(f"--out {given} is inside the {name} {cache}; outputs never go into a cache",
                                "choose a directory outside the cache")
        if out in cache.parents and cache.exists():
            raise BadInputError(f"--out {given} contains the {name} {cache}; outputs never replace a cache",
                                "choose a directory of its own")


def _refuse_inputs(out: Path, given: Path, inputs, files) -> None:
    for item in inputs:
        path = input_location(item)
        if path is None:
            continue
        src = path.resolve()
        home = _home_of(src)
        if out == src:
            raise BadInputError(f"--out {given} is the input {item}; outputs never replace an input")
        if out in src.parents:
            raise BadInputError(f"--out {given} contains the input {item}; choose another directory")
        if home is not None and (out == home or home in out.parents):
            what = "the folder holding the input" if home != src else "the input"
            raise BadInputError(f"--out {given} is inside {what} {item} ({home}); outputs never go into an input's "
                                "directory", "keep outputs in a folder of their own, e.g. --out runs/NAME")
    for item in files:
        src = Path(item).expanduser().resolve()
        if out == src or out in src.parents:
            raise BadInputError(f"--out {given} is or contains the input {item}; choose another directory")


def _refuse_location(out: Path, given: Path) -> None:
    """A place where neither OUT.partial nor OUT can be made, or a mount point (which cannot be renamed onto)."""
    anchor = _first_existing(out.parent)
    if not anchor.is_dir():
        raise BadInputError(f"--out {given}: {anchor} is a file, so the directory cannot be made")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise BadInputError(f"--out {given}: {anchor} is not writable (read-only or no permission), so neither "
                            f"{out.name}.partial nor {out.name} can be written there", "choose a writable location")
    if out.exists() and os.path.ismount(out):
        raise BadInputError(f"--out {given} is a mount point; a run is built beside it in {out.name}.partial and "
                            "renamed onto it, which a mount point cannot take", f"use a directory inside it: {given}/run")


def partial_dir_for(out: Path) -> Path:
    out = Path(out).resolve()
    return out.parent / (out.name + ".partial")


TEMPORARY_SUFFIXES = (".tmp", ".partial", ".part")


def remove_temporaries(root: Path) -> None:
    """Delete half-written files (`*.tmp`, `*.partial`, `*.part`) under `root`: a failed or full-disk write."""
    for path in sorted(Path(root).rglob("*"), reverse=True):
        if path.suffix in TEMPORARY_SUFFIXES:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _has_checkpoint(partial: Path) -> bool:
    checkpoints = partial / CHECKPOINTS
    return checkpoints.is_dir() and any(p.is_file() for p in checkpoints.rglob("*"))


def _umask() -> int:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normalize_modes(root: Path) -> None:
    """Give every file and directory under `root` the mode a new one gets under the umask (0644 / 0755 with the
    usual 022; an executable file stays executable): some writers (safetensors) create their files 0600, which
    would hide weights from other users of an output that the run's other files share."""
    mask = _umask()
    for path in [Path(root), *Path(root).rglob("*")]:
        if path.is_symlink():
            continue
        try:
            executable = path.is_dir() or path.stat().st_mode & 0o111
            path.chmod((0o777 if executable else 0o666) & ~mask)
        except OSError:  # not ours to change (a foreign file system): leave it
            pass


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


@dataclass
class PartialState:
    """What a failed run left behind, attached to its exception as `iclrkit_partial` (the runner says it in the
    error's one line): `kept` when OUT.partial keeps checkpoints for --resume, else it was removed."""

    path: Path
    kept: bool
    bytes: int = 0

    def note(self, resumable: bool, say_removed: bool = False) -> str:
        """What to add to the error's line: the kept checkpoints and what to do with them; "" when nothing was kept
        (unless `say_removed`: a full disk, where the user wonders what was left)."""
        if not self.kept:
            return "partial files removed" if say_removed else ""
        if not resumable:  # bad input: its own hint says what to do (a fresh run replaces OUT.partial)
            return ""
        size = f" ({self.bytes / 1024:.0f} KB)" if self.bytes < 1 << 20 else f" ({self.bytes / (1 << 20):.1f} MB)"
        return f"checkpoints kept in {self.path}{size}: rerun the same command with --resume to continue"


READER_ERRORS = ("SafetensorError", "JSONDecodeError", "UnpicklingError", "EOFError", "BadZipFile")


def _unreadable_checkpoint(exc: BaseException, partial: Path) -> BadInputError | None:
    """A --resume run that failed reading a file (a reader's own error type, not a named IclrkitError): almost surely
    a damaged checkpoint that the readers without `reading_checkpoint` did not name. Bad input, with a fresh run as
    the way out, instead of advice to --resume once more."""
    from toolkit.core.errors import RESUME_HINT, IclrkitError, is_refused_pickle

    if isinstance(exc, (IclrkitError, KeyboardInterrupt)) or not isinstance(exc, Exception):
        return None
    text = str(exc).strip()
    if not (type(exc).__name__ in READER_ERRORS or is_refused_pickle(exc) or "PytorchStreamReader" in text):
        return None
    first = text.splitlines()[0] if text else ""
    return BadInputError(f"--resume could not read its checkpoints in {partial / CHECKPOINTS}: "
                         f"{type(exc).__name__}: {first}"[:400], RESUME_HINT)


@contextlib.contextmanager
def atomic_dir(out: Path, overwrite: bool = False, resume: bool = False) -> Iterator[Path]:
    """Build in `OUT.partial`, rename onto OUT only when the block succeeds.

    Without --resume a stale `OUT.partial` is wiped first; with --resume it is reused. A failed run keeps it only
    when it holds checkpoints (so --resume can continue); nothing half-written ever appears at OUT. An existing
    empty directory at OUT is replaced; file modes follow the umask (normalize_modes).
    """
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_dir_for(out)
    if partial.exists() and not resume:
        shutil.rmtree(partial)
    partial.mkdir(exist_ok=True)
    try:
        yield partial
    except BaseException as exc:
        remove_temporaries(partial)
        kept = _has_checkpoint(partial)
        state = PartialState(partial, kept, _size(partial) if kept else 0)
        if not kept:
            shutil.rmtree(partial, ignore_errors=True)
        unreadable = _unreadable_checkpoint(exc, partial) if resume and kept else None
        if unreadable is not None:  # --resume again would fail again: say so, and name the way out
            unreadable.iclrkit_partial = state
            raise unreadable from None
        try:
            exc.iclrkit_partial = state
        except AttributeError:  # an exception type without a __dict__: say it the old way
            log.warning("%s", state.note(resumable=True))
        raise
    shutil.rmtree(partial / CHECKPOINTS, ignore_errors=True)
    normalize_modes(partial)
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()  # an empty directory (the user's own, checked before the run): the results take its place
    elif out.exists() or out.is_symlink():
        if not overwrite:
            raise BadInputError(f"--out {out} was filled by something else while this run was going; the results "
                                f"stay in {partial}")
        shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
    os.replace(partial, out)
