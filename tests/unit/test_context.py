from pathlib import Path

import pytest

from toolkit.core.context import atomic_dir, check_out_dir, partial_dir_for, resolve_device
from toolkit.core.errors import BadInputError, ResourceError


def test_explicit_cuda_without_cuda_fails_fast():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ResourceError) as info:
        resolve_device("cuda")
    assert info.value.exit_code == 3
    assert resolve_device("auto") == "cpu"
    with pytest.raises(BadInputError):
        resolve_device("tpu")


def test_out_dir_rules(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(BadInputError, match="inside the input"):
        check_out_dir(model / "out", False, [model])
    with pytest.raises(BadInputError, match="not empty"):
        check_out_dir(model, False, [])
    with pytest.raises(BadInputError, match="not an iclrkit output"):
        check_out_dir(model, True, [])  # --overwrite alone never deletes a directory iclrkit did not write
    check_out_dir(model, True, [], force=True)
    (model / "run.json").write_text("{}")
    check_out_dir(model, True, [])  # an earlier run's output: --overwrite is enough
    check_out_dir(tmp_path / "fresh", False, [model])
    data = tmp_path / "sets" / "data.txt"  # not in the working directory
    data.parent.mkdir()
    data.write_text("x")
    with pytest.raises(BadInputError, match="inside the folder holding the input"):
        check_out_dir(data.parent / "beside-the-data", False, [data])  # its folder may hold what it names (issue 45)
    check_out_dir(tmp_path / "elsewhere", False, [data])
    with pytest.raises(BadInputError, match="contains the input"):
        check_out_dir(tmp_path, True, [data])


def test_a_data_file_in_the_working_directory_claims_no_folder(tmp_path, monkeypatch):
    """`-d valid.txt -o runs/x` (the help examples' layout) works; the file itself and its parents stay protected."""
    data = tmp_path / "valid.txt"
    data.write_text("x")
    monkeypatch.chdir(tmp_path)
    check_out_dir(Path("runs") / "x", False, [Path("valid.txt")])
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(BadInputError, match="inside the folder holding the input"):
        check_out_dir(tmp_path / "runs", False, [data])
    monkeypatch.chdir(tmp_path / ".." / tmp_path.name)
    with pytest.raises(BadInputError, match="existing file"):
        check_out_dir(Path("valid.txt"), True, [Path("valid.txt")], force=True)


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as partial:
            (partial / "half.txt").write_text("x")
            raise RuntimeError("boom")
    assert not out.exists() and not partial_dir_for(out).exists()
    with atomic_dir(out) as partial:
        (partial / "done.txt").write_text("x")
    assert (out / "done.txt").exists() and not partial_dir_for(out).exists()


def test_failed_run_with_checkpoints_keeps_partial_for_resume(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as partial:
            (partial / "checkpoints").mkdir()
            (partial / "checkpoints" / "block_0").write_text("x")
            raise RuntimeError("killed")
    assert not out.exists() and (partial_dir_for(out) / "checkpoints" / "block_0").exists()
    with atomic_dir(out, resume=True) as partial:
        assert (partial / "checkpoints" / "block_0").exists()
    assert out.exists() and not (out / "checkpoints").exists()


def test_out_dir_never_inside_the_zoo_or_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(tmp_path / "zoo"))
    cached = tmp_path / "zoo" / "gpt2-tiny"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    for out in (cached, tmp_path / "zoo" / "other", tmp_path / "zoo"):
        with pytest.raises(BadInputError, match="inside the (zoo|iclrkit) cache"):
            check_out_dir(out, True, ["zoo:gpt2-tiny"], force=True)
    from huggingface_hub import constants

    with pytest.raises(BadInputError, match="inside the Hugging Face cache"):
        check_out_dir(Path(constants.HF_HUB_CACHE) / "models--org--name", True, ["org/name"], force=True)
    assert (cached / "config.json").exists()


def test_zoo_input_guarded_even_when_the_zoo_moves(tmp_path, monkeypatch):
    """zoo:NAME resolves to its cache directory before the guard, so --out inside it is refused by name."""
    from toolkit.core.context import input_location

    monkeypatch.setenv("ICLRKIT_ZOO_DIR", str(tmp_path / "z"))
    assert input_location("zoo:gpt2-tiny") == tmp_path / "z" / "gpt2-tiny"
    assert input_location("org/name").name == "models--org--name"
    assert input_location(tmp_path) == tmp_path


def test_failed_run_removes_temporaries_and_an_empty_checkpoint_dir(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError):
        with atomic_dir(out) as partial:
            (partial / "checkpoints").mkdir()
            (partial / "checkpoints" / "ln_free.tmp").write_bytes(b"x" * 1000)
            raise OSError(28, "No space left on device")
    assert not out.exists() and not partial_dir_for(out).exists()


def test_disk_full_is_recognised_through_the_chain():
    from toolkit.core.errors import ResourceError, is_disk_full, translate

    assert is_disk_full(OSError(28, "No space left on device"))
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from inner
    except RuntimeError as outer:
        mapped = translate(outer)
    assert isinstance(mapped, ResourceError) and mapped.exit_code == 3
    assert not is_disk_full(RuntimeError("shape mismatch")) and translate(ValueError("x")).__class__ is ValueError


def test_progress_logs_lines_when_stderr_is_not_a_tty(monkeypatch):
    import io

    from toolkit.core import progress as progress_module
    from toolkit.core.context import RunContext

    stream = io.StringIO()
    monkeypatch.setattr(progress_module.sys, "stderr", stream)
    monkeypatch.setenv("ICLRKIT_PROGRESS_EVERY", "0")
    assert list(RunContext().progress(range(5), total=5, description="blocks")) == list(range(5))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("progress blocks 1/5 elapsed 0:00:0")
    assert lines[-1].startswith("progress blocks 5/5 ") and " eta 0:00:00" in lines[-1]
    stream.seek(0)
    stream.truncate(0)
    monkeypatch.setenv("ICLRKIT_PROGRESS_EVERY", "3600")  # steady rate: nothing until an hour passed, then the end
    list(RunContext().progress(iter(range(7)), total=7, description="steps"))
    assert [line.split()[2] for line in stream.getvalue().splitlines()] == ["7/7"]
    clock = iter([0.0, 4.0, 9.0, 11.0, 19.0, 23.0])  # item ends at 4, 9, 11, 19, 23 s; a line every >= 10 s
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    stream.seek(0)
    stream.truncate(0)
    from toolkit.core.progress import log_lines

    assert list(log_lines(range(5), None, "batches", every_s=10.0, stream=stream)) == list(range(5))
    assert [line.split()[2] for line in stream.getvalue().splitlines()] == ["3", "5"]
    stream.seek(0)
    stream.truncate(0)
    list(RunContext(quiet=True).progress(range(3), total=3, description="quiet"))
    assert stream.getvalue() == ""


def test_progress_eta_arithmetic():
    from toolkit.core.progress import format_line

    assert format_line("ppl", 2, 10, 20.0) == "progress ppl 2/10 elapsed 0:00:20 eta 0:01:20"
    assert format_line("x", 3, None, 3725.0) == "progress x 3 elapsed 1:02:05"
