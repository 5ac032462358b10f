"""Measures the runtime of each task section of README.md: the section's ```bash commands, exactly as printed, run
in order from a scratch folder (runs/readme-runtimes/, outside the committed tree), on one thread, and the section's
user + system CPU seconds and wall seconds (resource.getrusage(RUSAGE_CHILDREN) deltas over the whole section) are
written with their provenance to examples/readme/runtimes.json. scripts/render_results.py puts them into the README.

    python examples/readme/runtimes.py                         every section, cheapest first
    python examples/readme/runtimes.py --sections khc,studies  only these; other rows of runtimes.json are kept
    python examples/readme/runtimes.py --list                  the sections and their commands, nothing run

A section is keyed by the runtime marker in its text (`<!-- runtime:KEY -->`). The commands run with `iclrkit` as
this checkout's CLI (`python -m cli.main`), ICLRKIT_THREADS=1 and OMP_NUM_THREADS=1; `examples/` in the scratch
folder is a link to the project's, so the sample-input paths resolve as they do from the project root. Zoo models come
from the user's zoo cache (built on first use, which is then part of the measured time).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import provenance  # noqa: E402

OUT = ROOT / "examples" / "readme" / "runtimes.json"
SCRATCH = ROOT / "runs" / "readme-runtimes"
MARKER = re.compile(r"<!-- runtime:([a-z0-9-]+) -->")
# cheapest first (by the CPU seconds in runtimes.json), so that partial progress covers the most sections
ORDER = ["fame", "bench", "steer", "khc", "rag", "unlearn", "tokur", "studies", "mbunet", "edit", "compress", "merge"]
# sections whose commands need something this machine cannot provide offline: {key: why}
UNAVAILABLE: dict[str, str] = {}


def bash_commands(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in joined.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def sections(text: str) -> dict[str, dict]:
    """{key: {"title", "commands"}} for every ### section of README.md that carries a runtime marker."""
    out = {}
    for part in re.split(r"\n(?=##)", text):
        m = MARKER.search(part)
        if not part.startswith("### ") or not m:
            continue
        blocks = re.findall(r"```bash\n(.*?)```", part, re.S)
        out[m.group(1)] = {"title": part.splitlines()[0][4:].strip(),
                           "commands": [c for b in blocks for c in bash_commands(b)]}
    return out


def argv(command: str) -> list[str]:
    args = shlex.split(command)
    if args[0] != "iclrkit":
        raise ValueError(f"not an iclrkit command: {command}")
    return [sys.executable, "-m", "cli.main", *args[1:]]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def code_state(out: Path = OUT) -> str:
    """provenance.code_state(), not counting this script's own output file as an uncommitted code change (another
    run of this script may have just written it)."""
    state = provenance.code_state()
    if state.endswith("+dirty"):
        changed = provenance.git("status", "--porcelain", "--untracked-files=no", "--", "cli", "toolkit", "csrc",
                                 "examples", "scripts").splitlines()
        own = str(out.resolve().relative_to(ROOT)) if out.resolve().is_relative_to(ROOT) else None
        if own and all(line[3:] == own for line in changed):
            return state.removesuffix("+dirty")
    return state


def measure(key: str, sec: dict, scratch: Path, start_state: str) -> dict:
    """Runs one section's commands in a fresh scratch folder; stops at the first failing command."""
    folder = scratch / key
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ, PYTHONPATH=str(ROOT), ICLRKIT_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cpu0, wall0 = children_cpu(), time.monotonic()
    runs = []
    for command in sec["commands"]:
        c0, w0 = children_cpu(), time.monotonic()
        with open(folder / f"log-{len(runs)}.txt", "w") as log:
            rc = subprocess.run(argv(command), cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        runs.append({"command": command, "exit_code": rc, "cpu_s": round(children_cpu() - c0, 1),
                     "wall_s": round(time.monotonic() - w0, 1)})
        print(f"[{key}] rc={rc} cpu={runs[-1]['cpu_s']}s wall={runs[-1]['wall_s']}s  {command}", flush=True)
        if rc != 0:
            tail = (folder / f"log-{len(runs) - 1}.txt").read_text()[-1500:]
            runs[-1]["log_tail"] = tail
            break
    row = {"section": key, "title": sec["title"], "commands": runs,
           "ok": all(r["exit_code"] == 0 for r in runs) and len(runs) == len(sec["commands"]),
           "cpu_s": round(children_cpu() - cpu0, 1), "wall_s": round(time.monotonic() - wall0, 1),
           "threads": 1}
    cmd = "python examples/readme/runtimes.py --sections " + key
    row.update(provenance.current(cmd, "examples/readme/runtimes.py", load_start=load_start, seed=None,
                                  start_state=start_state))
    row["seed"] = "the commands' defaults"
    return row


def merge(rows: list[dict], path: Path = OUT) -> dict:
    """Adds `rows` to the file (replacing the sections they measure), under a lock: two runs of this script on
    different sections may share the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    SCRATCH.parent.mkdir(parents=True, exist_ok=True)
    with open(SCRATCH.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _merge(rows, path)


def _merge(rows: list[dict], path: Path) -> dict:
    data = json.loads(path.read_text()) if path.exists() else {}
    by_key = {r["section"]: r for r in data.get("sections", [])}
    for r in rows:
        by_key[r["section"]] = r
    order = {k: i for i, k in enumerate(ORDER)}
    data = {"about": "CPU (user + system) and wall seconds of each README task section's commands, one thread; "
                     "written by examples/readme/runtimes.py, rendered into README.md by scripts/render_results.py",
            "sections": sorted(by_key.values(), key=lambda r: order.get(r["section"], len(order)))}
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    return data


def main(argv_: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", help="comma-separated section keys (default: all, cheapest first)")
    ap.add_argument("--list", action="store_true", help="print the sections and their commands; run nothing")
    ap.add_argument("--scratch", type=Path, default=SCRATCH)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv_)
    secs = sections((ROOT / "README.md").read_text())
    keys = args.sections.split(",") if args.sections else sorted(secs, key=lambda k: ORDER.index(k)
                                                                   if k in ORDER else len(ORDER))
    unknown = [k for k in keys if k not in secs]
    if unknown:
        print(f"unknown section(s) {unknown}; README has {sorted(secs)}", file=sys.stderr)
        return 2
    if args.list:
        for k in keys:
            print(f"{k}: {secs[k]['title']}")
            for c in secs[k]["commands"]:
                print(f"    {c}")
        return 0
    # the code state when this script starts: the commands run this code (runtimes.json, written after each
    # section, would otherwise mark the later sections dirty)
    start_state = code_state(args.out)
    for k in keys:
        if k in UNAVAILABLE:
            row = {"section": k, "title": secs[k]["title"], "skipped": UNAVAILABLE[k],
                   "commands": [{"command": c} for c in secs[k]["commands"]]}
        else:
            row = measure(k, secs[k], args.scratch, start_state)
        merge([row], args.out)  # after every section, so that partial progress is kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
