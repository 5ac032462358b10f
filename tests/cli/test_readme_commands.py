"""Every command in README.md's ```bash blocks runs, and writes the `runs/...` outputs its "Output:" line names.

The commands run in-process from a scratch directory as written, except for the substitutions below: tiny models
stand in for the zoo models and the user's model, and sizes are cut so that the whole README runs in about a minute.
Files a block reads that a user would bring (notes.jsonl, EasyEdit hparams, a KnowEdit file, benchmark data) are
written at the same relative paths first; OpenAI-compatible servers are loopback servers with scripted replies.
`make demo` and `make test` are not run here: `make test` is this suite, and the demo's compression is covered by
tests/cli/test_compress*.py."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from toolkit.bench.scripted import scripted_vlm
from toolkit.llm.server import LoopbackServer

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = {"make demo", "make test"}

# (pattern, replacement) on each command line, in order. {llama}, {gpt2}, {vlm}, {judge} are filled in per run.
SUBSTITUTIONS = [
    (r"zoo:smollm2-135m|\./my-model", "{llama}"),
    (r"\./gpt2-xl", "{gpt2}"),
    (r"zoo build llama-small", "zoo build gpt2-tiny"),
    (r"@http://localhost:8000/v1", "@{vlm}"),
    (r"@http://localhost:8001/v1", "@{judge}"),
    (r"(?<![\w/])examples/", str(ROOT / "examples") + "/"),
    (r"--nsamples 16 --seqlen 256", "--nsamples 2 --seqlen 32"),
    (r"--max-length 512 --stride 256", "--max-length 64 --stride 32"),
    (r"--steps 300", "--steps 3"),
    (r"--epochs 2", "--epochs 1"),
    (r"--layer 15", "--layer 1"),
    (r"--candidates 4", "--candidates 2"),
    (r"--mu 1,2", "--mu 1"),
    (r"khc generate -n 24", "khc generate -n 12"),
    (r"explain fame (.*)-n 10", r"explain fame \1-n 2"),
    (r"--concurrency 8", "--concurrency 2"),
]
# Flags appended (after the command's own) to keep tiny runs short; the command's behaviour is otherwise as written.
FAST = {
    "edit": ["--steps", "2", "--set", "cov_tokens=512", "--set", "cov_seqlen=32", "--set", "fluency_samples=1",
             "--set", "fluency_tokens=5", "--set", "context_prefixes=1", "--set", "prefix_tokens=3"],
    "unlearn prism": ["--max-length", "24", "--batch-size", "2"],
    "merge zoo": ["--set", "backbone_epochs=1", "--set", "finetune_epochs=1"],
    "merge latent train": ["--stage1-steps", "3", "--stage2-steps", "2", "--set", "d_model=16", "--set", "heads=2",
                           "--set", "encoder_layers=1", "--set", "decoder_layers=1", "--set", "latent_dim=16",
                           "--set", "window=4", "--set", "compression=2", "--set", "batch_size=8"],
    "uq tokur": ["--samples", "2", "--max-new-tokens", "4", "--set", "search_iterations=2", "--set", "anchor_size=2"],
    "rag deeprag run": ["--limit", "2", "--max-steps", "2"],
    "study benign-overfit": ["--steps", "50", "--repeats", "1"],
    "bench videomathqa": ["--limit", "2"],
}

TINY_HPARAMS = """alg_name: MEMIT
model_name: ./hugging_cache/not-used
layers: [0, 1]
clamp_norm_factor: 0.75
v_num_grad_steps: 2
v_lr: 5e-1
mom2_update_weight: 15000
"""


def readme_blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """(commands, outputs) for every ```bash block: commands joined over trailing backslashes, comments and blank
    lines dropped; outputs = the backticked `runs/...` paths of the "Output:" paragraph right after the block."""
    out = []
    for m in re.finditer(r"```bash\n(.*?)```\n(.*?)(?=\n\n|\Z)", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", m.group(1))
        commands = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
        commands = [c for c in commands if c and not c.startswith("#")]
        after = m.group(2).strip()
        outputs = re.findall(r"`(runs/[^`\s]+)`", after) if after.startswith("Output:") else []
        out.append((commands, outputs))
    return out


def test_the_readme_blocks_are_found():
    blocks = readme_blocks((ROOT / "README.md").read_text())
    commands = [c for cmds, _ in blocks for c in cmds]
    assert {c.split("  ")[0].strip() for c in commands if c.startswith("make")} == NOT_RUN
    assert all(c.startswith(("iclrkit ", "make ")) for c in commands), commands
    # the tasks of the README, each with at least one command and one named output
    assert sum(1 for cmds, outs in blocks if outs) >= 12


def _prepare(tmp: Path, tiny_gpt2_dir: Path):
    """The files a user would bring, at the paths the README's commands name."""
    from toolkit.data.text import embedded_text

    (tmp / "notes.jsonl").write_text("".join(json.dumps({"text": embedded_text()[i:i + 400]}) + "\n"
                                             for i in range(0, 4000, 400)))
    hp = tmp / "EasyEdit" / "hparams" / "MEMIT" / "gpt2-xl.yaml"
    hp.parent.mkdir(parents=True)
    hp.write_text(TINY_HPARAMS)
    (tmp / "wiki_counterfact_test_cf.json").write_text(json.dumps([
        {"subject": "object", "prompt": "The value of object is", "target_new": "return", "ground_truth": "class",
         "locality": {"Relation_Specificity": [{"prompt": "The value of type is", "ground_truth": [["class"]]}]}}]))


def _command(line: str, values: dict) -> list[str]:
    for pattern, repl in SUBSTITUTIONS:
        line = re.sub(pattern, repl, line)
    line = line.format(**values)
    args = shlex.split(line)
    assert args[0] == "iclrkit", line
    args = args[1:]
    key = " ".join(a for a in args[:3] if not a.startswith("-"))
    for prefix, extra in FAST.items():
        if key.startswith(prefix):
            args += extra
    return args


def test_every_readme_command_runs_and_writes_what_the_readme_says(cli, tmp_path, monkeypatch, tiny_llama_dir,
                                                                   tiny_gpt2_dir):
    from cli.main import app  # noqa: F401  (the in-process CLI the `cli` fixture drives)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ICLRKIT_CACHE_DIR", str(tmp_path / "cache"))
    _prepare(tmp_path, tiny_gpt2_dir)
    # the bench fixtures the Interop example reads as data/videomathqa
    assert cli(["bench", "fixtures", "-o", "data"]).exit_code == 0
    blocks = readme_blocks((ROOT / "README.md").read_text())
    ran = 0
    with LoopbackServer(reply=scripted_vlm) as vlm, LoopbackServer(reply=scripted_vlm) as judge:
        values = {"llama": str(tiny_llama_dir), "gpt2": str(tiny_gpt2_dir), "vlm": vlm, "judge": judge}
        for commands, outputs in blocks:
            for line in commands:
                if line.split("  ")[0].strip() in NOT_RUN:
                    continue
                args = _command(line, values)
                result = cli(args)
                assert result.exit_code == 0, (line, args, result.stderr[-2000:])
                ran += 1
            for path in outputs:
                assert (tmp_path / path).exists(), (path, commands)
    assert ran >= 20
