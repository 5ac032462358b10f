import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from toolkit.core.errors import BadInputError
from toolkit.models.source import load_model
from toolkit.models.view import view_of
from toolkit.nn.hooks import capture, edit_output
from toolkit.nn.pipeline import run_sequential


def _forward_hooks(model):
    return sum(len(m._forward_hooks) for m in model.modules())


def test_capture_and_edit_are_removed_even_on_error(tiny_gpt2_dir):
    model, _ = load_model(str(tiny_gpt2_dir))
    ids = torch.randint(0, 100, (1, 8))
    with capture(model, ["transformer.h.0", "transformer.h.1.mlp"], what="output") as seen:
        model(ids)
    assert seen["transformer.h.0"][0].shape == (1, 8, 32) and len(seen["transformer.h.1.mlp"]) == 1
    with pytest.raises(RuntimeError):
        with edit_output(model, "transformer.h.0", lambda h: h * 0):
            raise RuntimeError("body failed")
    assert _forward_hooks(model) == 0
    with pytest.raises(BadInputError, match="no module"):
        with capture(model, ["transformer.h.9"]):
            pass


def test_capture_with_reduce_keeps_one_running_value(tiny_gpt2_dir):
    model, _ = load_model(str(tiny_gpt2_dir))
    windows = [torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with torch.no_grad(), capture(model, ["transformer.h.0"]) as every:
        for ids in windows:
            model(ids)
    with torch.no_grad(), capture(model, ["transformer.h.0"], reduce=lambda seen, out: (
            out.abs().amax((0, 1)) if seen is None else torch.maximum(seen, out.abs().amax((0, 1))))) as running:
        for ids in windows:
            model(ids)
    expected = torch.stack([h.abs().amax((0, 1)) for h in every["transformer.h.0"]]).amax(0)
    assert len(every["transformer.h.0"]) == 3 and torch.equal(running["transformer.h.0"], expected)
    assert _forward_hooks(model) == 0


def test_edit_output_changes_the_forward(tiny_gpt2_dir):
    model, _ = load_model(str(tiny_gpt2_dir))
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        base = model(ids).logits
        with edit_output(model, "transformer.h.1", lambda h: h + 1.0):
            edited = model(ids).logits
    assert not torch.allclose(base, edited) and _forward_hooks(model) == 0


@pytest.mark.parametrize("fixture", ["tiny_gpt2_dir", "tiny_llama_dir"])
def test_pipeline_propagation_equals_full_forward(fixture, request):
    model, _ = load_model(str(request.getfixturevalue(fixture)))
    layers = view_of(model).blocks
    windows = torch.randint(0, 100, (3, 16))
    last_inputs = []

    def on_block(step):
        if step.index == len(layers) - 1:
            last_inputs.extend(step.inputs)

    run_sequential(model, windows, on_block)
    with capture(model, [view_of(model).block_path(len(layers) - 1)], what="input") as seen, torch.no_grad():
        for window in windows:
            model(window[None])
    for ours, reference in zip(last_inputs, next(iter(seen.values()))):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys, torch
    from toolkit.models.source import load_model
    from toolkit.nn.pipeline import run_sequential
    model, _ = load_model(sys.argv[1])
    windows = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    def on_block(step):
        if step.index == 1 and sys.argv[3] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        for p in step.block.parameters():
            p.data.mul_(0.5)
        print("block", step.index, flush=True)
    run_sequential(model, windows, on_block, checkpoint_dir=__import__("pathlib").Path(sys.argv[2]),
                   resume=sys.argv[3] == "resume", fingerprint="fp")
    model.save_pretrained(sys.argv[4]) if len(sys.argv) > 4 else None
""")


def test_pipeline_resumes_after_a_real_kill(tiny_llama_dir, tmp_path):
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # the repository root
    killed = subprocess.run([sys.executable, script, tiny_llama_dir, ckpt, "kill"], capture_output=True, text=True,
                            env=env)
    assert killed.returncode == -9 and killed.stdout.split() == ["block", "0"]
    assert json.loads((ckpt / "progress.json").read_text())["done"] == 0
    resumed = subprocess.run([sys.executable, script, tiny_llama_dir, ckpt, "resume", tmp_path / "resumed"],
                             capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["block", "1"]  # block 0 was restored, not recomputed
    fresh = subprocess.run([sys.executable, script, tiny_llama_dir, tmp_path / "ckpt2", "none", tmp_path / "fresh"],
                           capture_output=True, text=True, env=env)
    assert fresh.returncode == 0, fresh.stderr
    a, _ = load_model(str(tmp_path / "resumed"), with_tokenizer=False)
    b, _ = load_model(str(tmp_path / "fresh"), with_tokenizer=False)
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


def test_resume_refuses_checkpoints_of_another_run(tiny_llama_dir, tmp_path):
    model, _ = load_model(str(tiny_llama_dir))
    windows = torch.randint(0, 100, (1, 8))
    run_sequential(model, windows, lambda step: None, checkpoint_dir=tmp_path, fingerprint="a")
    with pytest.raises(BadInputError, match="another run"):
        run_sequential(model, windows, lambda step: None, checkpoint_dir=tmp_path, resume=True, fingerprint="b")


def test_block_step_stops_after_the_given_module(tiny_llama_dir):
    model, _ = load_model(str(tiny_llama_dir))
    windows = torch.randint(0, 100, (3, 16))
    calls = {"o_proj": 0, "down_proj": 0}

    def on_block(step):
        if step.index:
            return
        attention, mlp = step.block.self_attn, step.block.mlp
        counters = [attention.o_proj.register_forward_hook(lambda *_: calls.__setitem__("o_proj", calls["o_proj"] + 1)),
                    mlp.down_proj.register_forward_hook(lambda *_: calls.__setitem__("down_proj", calls["down_proj"] + 1))]
        assert step.run(stop_after=attention.o_proj) is None
        assert calls == {"o_proj": 3, "down_proj": 0}
        assert len(step.run()) == 3 and calls == {"o_proj": 6, "down_proj": 3}
        for handle in counters:
            handle.remove()
        assert _forward_hooks(step.block) == 0

    run_sequential(model, windows, on_block)
