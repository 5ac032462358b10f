"""Issue 45's eleven inputs that slipped through, and its smaller items: each gives one line on stderr, the documented
exit code, leaves the inputs as they were, and refuses before the run whatever can be known before it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

PPL = ["eval", "ppl", "--max-windows", "1", "--max-length", "32"]
GPTQ = ["compress", "gptq", "--nsamples", "2", "--seqlen", "16", "--set", "eval_windows=1", "--set",
        "eval_max_length=16", "--set", "export=none"]


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    for file in files:
        digest.update(str(file).encode() + file.read_bytes())
    return digest.hexdigest()


def _one_line(result, code: int, *needles: str, started: bool = False) -> str:
    """Exit `code` and one line on stderr holding `needles`; a run that had `started` may have said what it was
    doing before (warnings, progress), but its error is still one line, the last."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code, result.stderr
    if started:
        assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
        lines = lines[-1:]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def cli():
    """This module runs the console script's entry point (root options anywhere, usage errors as one line)."""
    from testkit import run_iclrkit

    return run_iclrkit


@pytest.fixture()
def never_scores(monkeypatch):
    """eval ppl's run() raises if reached: a refusal that must come before the run proves it did."""
    import toolkit.eval.run as run

    def reached(*args, **kwargs):
        raise AssertionError("the run started: this input should have been refused before it")

    monkeypatch.setattr(run, "run_perplexity", reached)


# 1 ------------------------------------------------------------------------------------------------------------------
def test_an_existing_empty_directory_as_out_is_used(cli, tiny_gpt2_dir, text_file, tmp_path):
    out = tmp_path / "e"
    out.mkdir()
    result = cli(PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", out, "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads((out / "run.json").read_text())["status"] == "ok"
    assert not (tmp_path / "e.partial").exists()


def test_atomic_dir_replaces_an_empty_directory_and_refuses_a_filled_one(tmp_path):
    from toolkit.core.context import atomic_dir
    from toolkit.core.errors import BadInputError

    out = tmp_path / "o"
    out.mkdir()
    with atomic_dir(out) as partial:
        (partial / "x").write_text("1")
    assert (out / "x").read_text() == "1"
    other = tmp_path / "p"
    with pytest.raises(BadInputError, match="filled by something else while this run was going"):
        with atomic_dir(other) as partial:
            other.mkdir()
            (other / "theirs").write_text("keep")
            (partial / "x").write_text("1")
    assert (other / "theirs").read_text() == "keep" and (tmp_path / "p.partial" / "x").exists()


# 2 ------------------------------------------------------------------------------------------------------------------
def _fail_on_block(monkeypatch, block: int, exc: BaseException) -> None:
    """The layer pipeline raises `exc` when it is about to save block `block` (block 0 .. block-1 are checkpointed)."""
    import toolkit.nn.pipeline as pipeline

    real = pipeline._save_progress

    def save(directory, index, *args, **kwargs):
        if index == block:
            raise exc
        return real(directory, index, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_save_progress", save)


def test_full_disk_is_one_line_that_says_what_was_kept(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    out = tmp_path / "c2"
    _fail_on_block(monkeypatch, 1, OSError(28, "No space left on device"))
    args = GPTQ + ["-m", tiny_llama_dir, "-d", text_file, "-o", out]
    line = _one_line(cli(args), 3, "no space left on device", f"checkpoints kept in {tmp_path / 'c2.partial'}",
                     "--resume")
    assert "removed" not in line and not out.exists()
    assert (tmp_path / "c2.partial" / "checkpoints" / "block_0.safetensors").is_file()
    monkeypatch.undo()
    resumed = cli(args + ["--resume"])
    assert resumed.exit_code == 0, resumed.stderr
    assert "blocks 0..0 restored from" in resumed.stderr  # the smaller item: --resume says where it resumed


def test_full_disk_without_checkpoints_says_they_were_removed(cli, tiny_gpt2_dir, text_file, tmp_path, monkeypatch):
    import toolkit.eval.perplexity as perplexity

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(perplexity, "perplexity", full)
    _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", tmp_path / "o"]), 3, "no space left on device",
              "partial files removed")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


# 3 ------------------------------------------------------------------------------------------------------------------
def test_overwrite_force_never_deletes_iclrkits_own_cache(cli, tiny_gpt2_dir, text_file, tmp_path, monkeypatch,
                                                          never_scores):
    cache = tmp_path / "cache"
    (cache / "edit-stats").mkdir(parents=True)
    (cache / "edit-stats" / "cov.pt").write_bytes(b"statistics")
    monkeypatch.setenv("ICLRKIT_CACHE_DIR", str(cache))
    for out in (cache, cache / "edit-stats", cache / "new"):
        result = cli(["--force"] + PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", out, "--overwrite"])
        _one_line(result, 2, "inside the iclrkit cache")
    result = cli(["--force"] + PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", tmp_path, "--overwrite"])
    _one_line(result, 2, "contains")  # the cache's parent would take the cache with it
    assert (cache / "edit-stats" / "cov.pt").read_bytes() == b"statistics"


# 4 ------------------------------------------------------------------------------------------------------------------
@pytest.fixture()
def read_only_dir(tmp_path):
    """A directory nothing can be written into: chmod 0555, or for root (whom permissions do not stop) a read-only
    tmpfs mounted there; skipped where neither works."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("running as root without a read-only mount: nothing here is read-only for root")
    yield path
    subprocess.run(["umount", str(path)], check=False)


def test_read_only_out_parent_is_refused_before_the_run(cli, tiny_gpt2_dir, text_file, read_only_dir, never_scores):
    for out in (read_only_dir / "out", read_only_dir / "deeper" / "out"):
        _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", out]), 2, "not writable")
    assert not any(read_only_dir.iterdir())


def test_an_empty_mount_point_as_out_is_refused_before_the_run(cli, tiny_gpt2_dir, text_file, read_only_dir,
                                                               never_scores):
    if not os.path.ismount(read_only_dir):
        pytest.skip("no mount point here (not root)")
    _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "-d", text_file, "-o", read_only_dir]), 2, "mount point")


# 5 ------------------------------------------------------------------------------------------------------------------
def test_out_inside_a_data_files_directory_is_refused(cli, tiny_gpt2_dir, tmp_path, never_scores):
    from toolkit.data.text import embedded_text

    dx = tmp_path / "dx"
    dx.mkdir()
    (dx / "file.txt").write_text(embedded_text()[:5000])
    before = _digest(dx)
    for out in (dx / "newout", dx / "a" / "b"):
        _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "-d", dx / "file.txt", "-o", out]), 2, "inside the folder holding "
                  "the input")
    # the same through --set and through a symlink into the folder
    _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "--set", f"data={dx / 'file.txt'}", "-o", dx / "n"]), 2, "inside")
    (tmp_path / "link").symlink_to(dx)
    _one_line(cli(PPL + ["-m", tiny_gpt2_dir, "-d", dx / "file.txt", "-o", tmp_path / "link" / "n"]), 2, "inside")
    assert _digest(dx) == before and sorted(p.name for p in dx.iterdir()) == ["file.txt"]


# 6 ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag,value", [("--max-windows", "0"), ("--max-windows", "-3"), ("--stride", "0"),
                                        ("--max-length", "0"), ("--max-length", "1")])
def test_counts_of_zero_or_below_are_refused_by_name(cli, tiny_gpt2_dir, text_file, tmp_path, flag, value,
                                                     never_scores):
    args = ["eval", "ppl", "-m", tiny_gpt2_dir, "-d", text_file, flag, value, "-o", tmp_path / "o"]
    line = _one_line(cli(args), 2, flag)
    assert flag == "--stride" or "stride" not in line
    assert not (tmp_path / "o").exists()


def test_a_stride_longer_than_the_window_is_refused_before_loading(cli, tmp_path):
    line = _one_line(cli(["eval", "ppl", "-m", tmp_path / "nothing-here", "--max-length", "64", "--stride", "128"]),
                     2, "--stride 128")
    assert "not found" not in line


# 7 ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command,flag", [(["unlearn", "ga", "--forget", "f.txt"], "--lr"),
                                          (["edit", "memit", "-d", "facts.json"], "--mom2-weight"),
                                          (["compress", "obr"], "--alpha"), (["eval", "ppl"], "--max-length")])
@pytest.mark.parametrize("value", ["inf", "-inf", "1e999", "nan"])
def test_non_finite_floats_are_refused_at_parse_time(cli, tmp_path, command, flag, value):
    """The model does not exist: a check that came after loading would say so instead of naming the flag."""
    result = cli([*command, "-m", tmp_path / "no-model", flag, value, "-o", tmp_path / "o"])
    line = _one_line(result, 2, flag)
    assert "not found" not in line and not (tmp_path / "o").exists()


# 8 ------------------------------------------------------------------------------------------------------------------
@pytest.fixture()
def interrupted_gptq(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    """A compress gptq run killed after block 0 was checkpointed: (args, OUT.partial/checkpoints)."""
    out = tmp_path / "c"
    args = GPTQ + ["-m", tiny_llama_dir, "-d", text_file, "-o", out]
    _fail_on_block(monkeypatch, 1, KeyboardInterrupt())
    assert cli(args).exit_code == 130
    monkeypatch.undo()
    assert (tmp_path / "c.partial" / "checkpoints" / "block_0.safetensors").is_file()
    return args, tmp_path / "c.partial" / "checkpoints"


def test_an_interrupt_is_one_line_that_says_where_to_resume(cli, tiny_llama_dir, text_file, tmp_path, monkeypatch):
    _fail_on_block(monkeypatch, 1, KeyboardInterrupt())
    line = _one_line(cli(GPTQ + ["-m", tiny_llama_dir, "-d", text_file, "-o", tmp_path / "c"]), 130, "interrupted",
                     "rerun the same command with --resume", started=True)
    assert str(tmp_path / "c.partial") in line


def test_a_resumed_compress_says_where_it_resumed(cli, interrupted_gptq):
    """The smaller item: `compress --resume` names the block it resumed after and where that checkpoint is."""
    args, checkpoints = interrupted_gptq
    result = cli(args + ["--resume"])
    assert result.exit_code == 0, result.stderr
    assert "resuming after block 0 of" in result.stderr and str(checkpoints) in result.stderr


@pytest.mark.parametrize("damage", ["truncated-block", "garbage-progress", "missing-block", "truncated-scales"])
def test_corrupt_checkpoints_on_resume_name_the_file(cli, interrupted_gptq, damage):
    args, checkpoints = interrupted_gptq
    target = {"truncated-block": "block_0.safetensors", "garbage-progress": "progress.json",
              "missing-block": "block_0.safetensors", "truncated-scales": "scales_0.safetensors"}[damage]
    path = checkpoints / target
    if damage == "garbage-progress":
        path.write_text("{not json")
    elif damage == "missing-block":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    line = _one_line(cli(args + ["--resume"]), 2, "without --resume")
    assert str(path) in line or (damage == "truncated-scales" and str(checkpoints) in line)
    assert "rerun the same command with --resume" not in line


def test_corrupt_or_hostile_remove_ln_checkpoint_is_bad_input(tmp_path):
    import pickle

    import torch

    from toolkit.core.context import RunContext
    from toolkit.core.errors import BadInputError
    from toolkit.remove_ln.train import _resume

    ctx = RunContext(out=tmp_path, resume=True)
    good = ctx.checkpoint_dir / "ln_free.pt"
    torch.save({"fingerprint": {}, "step": 1}, good)
    good.write_bytes(good.read_bytes()[:40])
    with pytest.raises(BadInputError, match="corrupt checkpoint .*ln_free.pt") as info:
        _resume(None, None, None, None, ctx, "ln_free", {})
    assert info.value.exit_code == 2 and "without --resume" in info.value.hint
    torch.save({"fingerprint": _Payload()}, good, pickle_module=pickle)
    with pytest.raises(BadInputError, match="pickle that is not plain tensors") as info:
        _resume(None, None, None, None, ctx, "ln_free", {})
    assert "weights_only" not in info.value.one_line()


class _Payload:
    def __reduce__(self):
        return (os.getcwd, ())  # harmless, but not a tensor: a weights-only load must refuse it


def test_a_refused_pickle_anywhere_is_one_line_exit_2_without_unsafe_advice():
    import pickle

    from toolkit.core.errors import translate

    try:
        raise pickle.UnpicklingError("Weights only load failed. ... set `weights_only=False` ... trusted source")
    except pickle.UnpicklingError as exc:
        mapped = translate(exc)
    assert mapped.exit_code == 2 and "weights_only" not in mapped.one_line() and "could run code" in mapped.message


# 9 ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama written as GGUF Q4_0 by iclrkit's own exporter (tokenizer included), and that model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolkit.compress.quant import fit_weight_scale, quantize_rows
    from toolkit.export.gguf import save_gguf
    from toolkit.export.quantized import from_model
    from toolkit.models.view import view_of

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    view = view_of(model)
    scales = {}
    for i, block in enumerate(view.blocks):
        for slot in view.slots(i):
            name = view.full_name(i, slot)
            scales[name] = fit_weight_scale(slot.weight(block), 4)
            slot.set_weight(block, quantize_rows(slot.weight(block), scales[name], 4))
    q = from_model(view, tiny_tokenizer, scales, 4, {"method": "rtn", "w_bits": 4, "a_bits": 16, "kv_bits": 16,
                                                     "rotation": None}, {})
    folder = tmp_path_factory.mktemp("gguf") / "models"
    save_gguf(q, folder, card={"command": "pytest"})
    return folder / "model-Q4_0.gguf"


def test_a_gguf_file_as_model_is_converted_once_and_loads(cli, tiny_gguf, text_file, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.data.text import load_text, tokenize
    from toolkit.eval.perplexity import perplexity
    from toolkit.models.source import load_tokenizer

    monkeypatch.setenv("ICLRKIT_CACHE_DIR", str(tmp_path / "cache"))
    before = _digest(tiny_gguf.parent)
    result = cli(PPL + ["-m", tiny_gguf, "-d", text_file, "-o", tmp_path / "ppl", "--json"])
    assert result.exit_code == 0, result.stderr
    assert "converting" in result.stderr
    record = json.loads(result.stdout)
    assert record["inputs"]["model"] == {"path": str(tiny_gguf), "sha256_of": "bytes",
                                         "sha256": hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()}
    reference = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name,
                                                     dtype=torch.float32).eval()
    ids = tokenize(load_tokenizer(str(tiny_gguf)), load_text(str(text_file)))
    expected = perplexity(reference, ids, max_length=32, max_windows=1)["ppl"]
    assert record["metrics"]["ppl"] == pytest.approx(expected, rel=1e-5)
    again = cli(PPL + ["-m", tiny_gguf, "-d", text_file])
    assert again.exit_code == 0 and "converting" not in again.stderr  # converted once
    converted = next((tmp_path / "cache" / "gguf").glob("model-Q4_0-*"))
    assert (converted / "config.json").is_file() and _digest(tiny_gguf.parent) == before


def test_a_broken_gguf_file_is_one_line_exit_2(cli, tmp_path, text_file, monkeypatch):
    monkeypatch.setenv("ICLRKIT_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "m" / "broken.gguf"
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF" + bytes(range(200)))
    _one_line(cli(PPL + ["-m", bad, "-d", text_file]), 2, "not a readable GGUF file", str(bad))
    assert not list((tmp_path / "cache" / "gguf").glob("broken-*"))


# 10 -----------------------------------------------------------------------------------------------------------------
def test_the_help_example_with_a_longer_window_than_the_model_runs(cli, tiny_gpt2_dir, text_file, tmp_path):
    result = cli(["eval", "ppl", "-m", tiny_gpt2_dir, "-d", text_file, "--max-length", "1024", "--stride", "512",
                  "--max-windows", "2", "--json"])
    assert result.exit_code == 0, result.stderr
    warnings = json.loads(result.stdout)["warnings"]
    assert "--max-length 1024 clamped to 128, the model's context length" in warnings
    assert "--stride 512 scaled to 64 with it (the same stride/max-length ratio)" in warnings


# 11 -----------------------------------------------------------------------------------------------------------------
@pytest.fixture()
def packed_run(cli, tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = cli(["compress", "rtn", "-m", tiny_llama_dir, "-d", text_file, "--nsamples", "2", "--seqlen", "16",
                  "--set", "eval_windows=1", "--set", "eval_max_length=16", "--set", "export=packed", "-o", out])
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("fmt", ["gguf", "compressed-tensors"])
@pytest.mark.parametrize("drop", ["model.layers.1.mlp.up_proj.qweight", "model.norm.weight"])
def test_a_packed_file_missing_a_tensor_names_it(cli, packed_run, tmp_path, fmt, drop):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    bad = tmp_path / "bad"
    shutil.copytree(packed_run / "packed", bad)
    weights = bad / "model.packed.safetensors"
    with safe_open(str(weights), framework="numpy") as handle:  # rewritten as a plain tool would: no metadata
        tensors = {k: handle.get_tensor(k) for k in handle.keys() if k != drop}  # noqa: SIM118
    save_file(tensors, str(weights))
    _one_line(cli(["export", fmt, bad, "--out", tmp_path / "x"]), 2, drop)
    assert not (tmp_path / "x").exists()


# smaller items --------------------------------------------------------------------------------------------------------
def test_sigterm_during_zoo_build_is_one_line_and_leaves_nothing(cli, tmp_path, monkeypatch):
    import sys
    import types

    import toolkit.zoo.registry as registry

    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(tmp_path / "zoo"))

    def build_slow(out, **kwargs):
        out.mkdir(parents=True, exist_ok=True)
        (out / "half.safetensors").write_bytes(b"x")
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the build")

    module = types.ModuleType("fake_zoo_slow")
    module.build_slow = build_slow
    monkeypatch.setitem(sys.modules, "fake_zoo_slow", module)
    monkeypatch.setitem(registry.RECIPES, "slow", registry.Recipe("fake_zoo_slow:build_slow", "test", "0"))
    _one_line(cli(["zoo", "build", "slow"]), 143, "terminated", started=True)
    assert not [p for p in (tmp_path / "zoo").iterdir() if not p.name.startswith(".")]


def test_saved_weights_get_the_modes_of_every_other_file(cli, packed_run):
    mask = os.umask(0o022)
    os.umask(mask)
    modes = {p.relative_to(packed_run).as_posix(): p.stat().st_mode & 0o777 for p in packed_run.rglob("*")}
    assert any(name.endswith(".safetensors") for name in modes)
    wanted = {name: (0o777 if (packed_run / name).is_dir() else 0o666) & ~mask for name in modes}
    assert modes == wanted


def test_a_data_files_sha256_is_that_of_its_bytes(cli, tiny_gpt2_dir, tmp_path):
    from toolkit.data.text import embedded_text

    folder = tmp_path / "data"
    folder.mkdir()
    text = embedded_text()[:5000].encode()
    digests = set()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_bytes(text)
        result = cli(PPL + ["-m", tiny_gpt2_dir, "-d", folder / name, "--json"])
        assert result.exit_code == 0, result.stderr
        data = json.loads(result.stdout)["inputs"]["data"]
        assert data["sha256_of"] == "bytes"
        digests.add(data["sha256"])
    assert digests == {hashlib.sha256(text).hexdigest()}


def test_a_directorys_sha256_is_that_of_its_sha256sum_manifest(tmp_path):
    from toolkit.core.report import sha256_of

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_bytes(b"one")
    (tmp_path / "a.txt").write_bytes(b"two")  # "./a.txt" sorts before "./a/b" as byte strings
    lines = "".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in
                    (("./a.txt", b"two"), ("./a/b", b"one")))
    assert sha256_of(tmp_path) == hashlib.sha256(lines.encode()).hexdigest()
    if shutil.which("sha256sum") and shutil.which("find"):
        shell = subprocess.run("find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum",
                               shell=True, cwd=tmp_path, capture_output=True, text=True).stdout.split()[0]
        assert sha256_of(tmp_path) == shell


def test_normalize_modes_follows_the_umask_and_keeps_scripts_executable(tmp_path):
    from toolkit.core.outdir import normalize_modes

    mask = os.umask(0o022)
    try:
        (tmp_path / "w.safetensors").write_bytes(b"x")
        (tmp_path / "w.safetensors").chmod(0o600)
        (tmp_path / "serve.sh").write_text("#!/bin/sh\n")
        (tmp_path / "serve.sh").chmod(0o700)
        normalize_modes(tmp_path)
    finally:
        os.umask(mask)
    assert (tmp_path / "w.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "serve.sh").stat().st_mode & 0o777 == 0o755
