"""Provenance of the published figures: every record of examples/*/results*.json says who wrote it.

A record is each dict in a top-level list of the file (`rows`, `seed_rows`, ...), and the file's top level itself
when it holds figures outside those lists (scalar files such as backdoor's, or mbunet's `speed`). Each record carries

    command   the command that wrote it, as run (env overrides included)
    commit    the git commit of the code that ran (`dirty` true when the tree had uncommitted changes)
    date      when it was written (UTC, ISO 8601)
    seed | seeds
    machine   {"cores": N, "load": [1, 5, 15 min load average] | "clean pair" | a sentence}
    repro     the script that wrote it (examples/NAME/repro.sh, ...)

and, where the row was not written by that script in this repository's history, `transcribed: true` with
`transcribed_reason` (the renderer shows such figures as unverified); where provenance was recovered afterwards from
git history, `provenance_from` says how. Repro scripts stamp their output at the end:

    python scripts/provenance.py stamp runs/repro-NAME/results.json --repro examples/NAME/repro.sh \
        --command "make repro-NAME" [--seed 0] [--load-start "$(cut -d' ' -f1-3 /proc/loadavg)"] \
        [--code-start "$(python scripts/provenance.py state)"]   # the state printed when the run started

which fills the fields of every record that has no `command` yet (rows copied from another run keep theirs).
Without --seed, `--seeds-from runs/repro-NAME --since EPOCH` takes the seed(s) from the run.json files the run wrote
there (what `make repro-NAME` does).
`python scripts/provenance.py check [FILES...]` lists records without provenance (exit 1 if any).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("command", "commit", "date", "machine", "repro")
PROVENANCE_KEYS = (*REQUIRED, "seed", "seeds", "dirty", "transcribed", "transcribed_reason", "provenance_from")
METADATA_KEYS = {"note", "notes", "source", "setting", "selection_rule", *PROVENANCE_KEYS}


def record_lists(data: dict) -> dict[str, list[dict]]:
    """The file's top-level lists of dicts, by key."""
    return {k: v for k, v in data.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}


def top_has_figures(data: dict) -> bool:
    """True when the top level holds something besides its lists of rows and metadata (then it is a record)."""
    lists = record_lists(data)
    return any(k not in lists and k not in METADATA_KEYS for k in data)


def records(data: dict) -> list[tuple[str, dict]]:
    """(where, record) for every record of a results file: the top level when it holds figures, then each row."""
    out = [("top level", data)] if top_has_figures(data) else []
    for key, rows in record_lists(data).items():
        out += [(f"{key}[{i}]", r) for i, r in enumerate(rows)]
    return out


def missing(record: dict) -> list[str]:
    """The provenance fields a record lacks (`seed` or `seeds` counts as one)."""
    lack = [k for k in REQUIRED if record.get(k) in (None, "")]
    if "seed" not in record and "seeds" not in record:
        lack.append("seed(s)")
    if record.get("transcribed") and not record.get("transcribed_reason"):
        lack.append("transcribed_reason")
    return lack


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def machine(load_start: str | None = None) -> dict:
    """Cores and load average now (and at the start of the run when given as '1 5 15')."""
    m = {"cores": os.cpu_count(), "load": [round(x, 2) for x in os.getloadavg()]}
    if load_start:
        m = {"cores": m["cores"], "load_start": [float(x) for x in load_start.split()[:3]], "load_end": m["load"]}
    return m


def code_state() -> str:
    """'HASH' of HEAD, or 'HASH+dirty' when cli/, toolkit/, csrc/, examples/ or scripts/ have uncommitted changes."""
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "cli", "toolkit", "csrc", "examples",
                     "scripts"))
    return git("rev-parse", "--short=7", "HEAD") + ("+dirty" if dirty else "")


def current(command: str, repro: str, load_start: str | None = None, seed=None, start_state: str | None = None) -> dict:
    """The provenance of a run finishing now in this checkout; `start_state` (code_state() taken when the run
    started) names the code that ran, else the checkout's state now."""
    state = start_state or code_state()
    prov = {"command": command, "commit": state.split("+")[0], "dirty": state.endswith("+dirty"),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine(load_start), "repro": repro}
    if seed is not None:
        prov["seed"] = seed
    return prov


def stamp(data: dict, prov: dict) -> int:
    """Adds `prov` to every record without a `command` (a row's own seed wins); returns how many were stamped."""
    n = 0
    for _, rec in records(data):
        if rec.get("command"):
            continue
        for k, v in prov.items():
            if k in ("seed", "seeds") and ("seed" in rec or "seeds" in rec):
                continue
            rec[k] = v
        n += 1
    return n


def seeds_from(folder: Path, since: float = 0.0):
    """The seed (or sorted seeds) recorded by the run.json files under `folder` written at or after `since`."""
    found = set()
    for path in Path(folder).rglob("run.json"):
        if path.stat().st_mtime >= since:
            try:
                seed = json.loads(path.read_text()).get("seed")
            except (OSError, ValueError):
                continue
            if isinstance(seed, int):
                found.add(seed)
    if not found:
        return None
    return found.pop() if len(found) == 1 else sorted(found)


def _seed(text: str | None):
    if text is None:
        return None
    parts = [int(s) for s in text.replace(",", " ").split()]
    return parts[0] if len(parts) == 1 else parts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stamp", help="fill the provenance of every record without a command")
    s.add_argument("file", type=Path)
    s.add_argument("--repro", required=True)
    s.add_argument("--command", required=True)
    s.add_argument("--seed", help="seed (or 'a b c' seeds) for records that carry none")
    s.add_argument("--load-start", help="'1 5 15' load average at the start of the run")
    s.add_argument("--code-start", help="`provenance.py state` printed when the run started (default: now)")
    s.add_argument("--seeds-from", type=Path, help="without --seed: the seeds of the run.json files under this folder")
    s.add_argument("--since", type=float, default=0.0, help="with --seeds-from: only run.json written after (epoch s)")
    sub.add_parser("state", help="print HEAD's short hash (+dirty): pass it to stamp --code-start")
    c = sub.add_parser("check", help="list records without provenance")
    c.add_argument("files", nargs="*", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "stamp":
        data = json.loads(a.file.read_text())
        seed = _seed(a.seed)
        if seed is None and a.seeds_from:
            seed = seeds_from(a.seeds_from, a.since)
        prov = current(a.command, a.repro, a.load_start, start_state=a.code_start)
        if seed is not None:
            prov["seeds" if isinstance(seed, list) else "seed"] = seed
        n = stamp(data, prov)
        a.file.write_text(json.dumps(data, indent=2) + "\n")
        print(f"provenance: {n} record(s) of {a.file} stamped ({prov['commit']}{' dirty' if prov['dirty'] else ''})",
              file=sys.stderr)
        return 0
    if a.cmd == "state":
        print(code_state())
        return 0
    files = a.files or sorted(ROOT.glob("examples/*/results*.json"))
    bad = 0
    for f in files:
        for where, rec in records(json.loads(Path(f).read_text())):
            lack = missing(rec)
            if lack:
                bad += 1
                print(f"{f}: {where} lacks {', '.join(lack)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
