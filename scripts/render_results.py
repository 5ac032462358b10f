"""Renders every published figure from the committed results: README.md's status table and the headline block of
each examples/NAME/RESULTS.md, from examples/NAME/results*.json and the project's copy of the benchmark targets
(scripts/results_gates.py), and the runtime of each README task section (between `<!-- runtime:KEY -->` and
`<!-- /runtime -->`) from examples/readme/runtimes.json. Prose around the blocks stays hand-written; the blocks are not edited by hand.

    python scripts/render_results.py            rewrite the generated blocks in place
    python scripts/render_results.py --check    exit 1 and name the files whose blocks differ (tests/unit run it)
    python scripts/render_results.py --gates    one line per technique: status, gate verdict, extra checks

A technique is `done` only when its gate holds, every extra check holds and no figure it reads is transcribed
(`transcribed: true` rows are unverified); otherwise `built`, with one line naming the failing claim, its figure and
the strongest fair baseline. The per-technique figures and tables live in scripts/results_tables.py.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
import results_tables as T  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
README_BEGIN = "<!-- BEGIN GENERATED status table: scripts/render_results.py renders it from examples/*/results*.json -->"
README_END = "<!-- END GENERATED status table -->"
HEAD_BEGIN = ("<!-- BEGIN GENERATED headline: scripts/render_results.py renders it from results*.json "
              "(edit those or the script, not this block) -->")
HEAD_END = "<!-- END GENERATED headline -->"


def loader(root: Path = ROOT):
    cache: dict[tuple[str, str], dict] = {}

    def load(name: str, file: str = "results.json") -> dict:
        key = (name, file)
        if key not in cache:
            cache[key] = json.loads((root / "examples" / name / file).read_text())
        return cache[key]
    return load


# ------------------------------------------------------------------------------------------------ rendering

def cell(text) -> str:
    """A table cell: pipes escaped (also inside code spans, as GitHub's tables need), no line breaks."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine_text(m) -> str:
    if isinstance(m, str):
        return m
    if not isinstance(m, dict):
        return str(m)
    parts = [f"{m['cores']} cores" if m.get("cores") else None]
    for key, label in (("load", "load"), ("load_start", "load at start"), ("load_end", "at end")):
        v = m.get(key)
        if isinstance(v, list):
            parts.append(f"{label} {' / '.join(f'{x:g}' for x in v)}")
        elif v:
            parts.append(f"{label} {v}")
    return ", ".join(p for p in parts if p)


def provenance_lines(records: list[dict]) -> list[str]:
    """One line per distinct (command, commit, date) among `records`, with how many records it wrote."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r.get("command"), r.get("commit"), r.get("date")), []).append(r)
    lines = []
    for (command, commit, date), members in groups.items():
        r = members[0]
        seeds = r.get("seeds", r.get("seed"))
        mark = " **transcribed, unverified**: " + r["transcribed_reason"] if r.get("transcribed") else ""
        how = f" ({r['provenance_from']})" if r.get("provenance_from") else ""
        dirty = " + uncommitted changes" if r.get("dirty") else ""
        lines.append(f"- {len(members)} row(s): `{command}` at {commit}{dirty}, {date}, seed(s) {seeds}, "
                     f"{machine_text(r.get('machine'))}; by {r.get('repro')}{how}{mark}")
    return lines


def headline_block(name: str, rep: T.Report) -> str:
    parts = [HEAD_BEGIN, f"**Status: {rep.status}** — {rep.line}", ""]
    for title, header, rows, _ in rep.tables:
        parts += [f"**{title}**", "", md_table(header, rows), ""]
    if rep.unverified:
        parts += ["† transcribed row: not written by a repro in this repository's history, so unverified.", ""]
    checks = []
    if rep.gate is not None:
        checks.append(f"- {'✓' if rep.gate[0] else '✗'} benchmark target (`scripts/results_gates.py {name}`): "
                      f"{rep.gate[1]}")
    checks += [f"- {'✓' if c.ok else '✗'} {c.line}" for c in rep.claims]
    if checks:
        parts += ["Checks:", *checks, ""]
    recs = list({id(r): r for r in rep.records + [r for t in rep.tables for r in t[3]]}.values())
    if recs:
        parts += ["Provenance of these rows:", *provenance_lines(recs), ""]
    parts.append(HEAD_END)
    return "\n".join(parts)


def replace_block(text: str, begin: str, end: str, block: str, anchor: str | None = None) -> str:
    """`text` with the block between `begin` and `end` replaced by `block` (which includes both markers); without
    markers, the block goes after the first line matching `anchor` (a regex) or after the first heading."""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    lines = text.split("\n")
    at = next((i for i, ln in enumerate(lines) if anchor and re.match(anchor, ln)), None)
    if at is None:
        at = next(i for i, ln in enumerate(lines) if ln.startswith("# "))
    return "\n".join(lines[:at + 1] + ["", block, ""] + lines[at + 1:])


def readme_table(reports: dict) -> str:
    rows = []
    for tech in T.TECHNIQUES:
        rep = reports[tech.name]
        link = f"[{tech.name}](examples/{tech.name}/RESULTS.md)"
        rows.append([tech.task, f"`{tech.command}`", tech.what, f"**{rep.status}**: {rep.line}", link])
    return "\n".join([README_BEGIN, md_table(["task", "command", "technique", "status (one line)", "figures"], rows),
                      README_END])


RUNTIME = re.compile(r"(<!-- runtime:([a-z0-9-]+) -->).*?(<!-- /runtime -->)", re.S)
RUNTIMES = ROOT / "examples" / "readme" / "runtimes.json"


def load_runtimes(path: Path = RUNTIMES) -> dict[str, dict]:
    """{section: row} of examples/readme/runtimes.json (written by examples/readme/runtimes.py); {} without it."""
    if not path.exists():
        return {}
    return {r["section"]: r for r in json.loads(path.read_text()).get("sections", [])}


def runtime_text(row: dict | None) -> str:
    """A README section's runtime, from its runtimes.json row: CPU time (user + system) of the section's commands
    on one thread; "not measured yet" without a row."""
    if row is None:
        return "not measured yet"
    if row.get("skipped"):
        return f"not measured ({row['skipped']})"
    at = row["commit"][:7] + (" + uncommitted changes" if row.get("dirty") else "")
    if not row.get("ok"):
        failed = next((c for c in row["commands"] if c.get("exit_code")), {})
        return f"not measured (a command exited {failed.get('exit_code')} at {at}; see examples/readme/runtimes.json)"
    cpu = row["cpu_s"]
    size = f"about {cpu:.0f} CPU-seconds" if cpu < 90 else f"about {cpu / 60:.0f} CPU-minutes"
    return f"{size} (one thread, measured at {at})"


def render_runtimes(text: str, runtimes: dict[str, dict]) -> str:
    """`text` with every runtime marker's content replaced by its section's measured runtime."""
    return RUNTIME.sub(lambda m: m.group(1) + runtime_text(runtimes.get(m.group(2))) + m.group(3), text)


def render_all(load=None, runtimes: dict[str, dict] | None = None) -> dict[Path, str]:
    """Every file with its generated blocks brought up to date: {path: new text}."""
    load = load or loader()
    runtimes = load_runtimes() if runtimes is None else runtimes
    reports = {t.name: t.report(load) for t in T.TECHNIQUES}
    out = {}
    for t in T.TECHNIQUES:
        path = ROOT / "examples" / t.name / "RESULTS.md"
        out[path] = replace_block(path.read_text(), HEAD_BEGIN, HEAD_END, headline_block(t.name, reports[t.name]))
    readme = ROOT / "README.md"
    out[readme] = render_runtimes(replace_block(readme.read_text(), README_BEGIN, README_END, readme_table(reports),
                                                anchor=r"^## What works"), runtimes)
    return out


def stale(load=None) -> list[Path]:
    return [p for p, text in render_all(load).items() if p.read_text() != text]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a committed block differs from the rendering")
    p.add_argument("--gates", action="store_true", help="print each technique's status and checks")
    a = p.parse_args(argv)
    if a.gates:
        load = loader()
        for t in T.TECHNIQUES:
            rep = t.report(load)
            gate = "no target" if rep.gate is None else ("OK " if rep.gate[0] else "FAIL ") + rep.gate[1]
            print(f"{t.name:15} {rep.status:5}  gate: {gate}")
            for c in rep.claims:
                print(f"{'':22}{'ok  ' if c.ok else 'FAIL'} {c.line}")
            if rep.unverified:
                print(f"{'':22}unverified (transcribed): {len(rep.unverified)} row(s)")
        return 0
    if a.check:
        bad = stale()
        for path in bad:
            print(f"{path.relative_to(ROOT)}: generated block out of date (python scripts/render_results.py)")
        missing = [f"{f.relative_to(ROOT)}: {w} lacks {', '.join(provenance.missing(r))}"
                   for f in sorted(ROOT.glob("examples/*/results*.json"))
                   for w, r in provenance.records(json.loads(f.read_text())) if provenance.missing(r)]
        print("\n".join(missing[:20]))
        return 1 if bad or missing else 0
    for path, text in render_all().items():
        if path.read_text() != text:
            path.write_text(text)
            print(f"rendered {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
