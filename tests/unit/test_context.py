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
    check_out_dir(model, True, [])
    check_out_dir(tmp_path / "fresh", False, [model])
    data = tmp_path / "data.txt"
    data.write_text("x")
    check_out_dir(tmp_path / "beside-the-data", False, [data])
    with pytest.raises(BadInputError, match="contains the input"):
        check_out_dir(tmp_path, True, [data])


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
