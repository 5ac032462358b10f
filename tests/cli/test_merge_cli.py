"""`iclrkit merge ...` end to end on a tiny digits zoo, and the bad inputs the issue names."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_VAE = ["--set", "d_model=16", "--set", "heads=2", "--set", "encoder_layers=1", "--set", "decoder_layers=1",
            "--set", "latent_dim=16", "--set", "window=4", "--set", "compression=2", "--set", "batch_size=8",
            "--set", "lr=3e-3", "--set", "checkpoint_every=5"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("mz") / "zoo"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    result = CliRunner().invoke(app, ["merge", "zoo", "--set", "widths=[8,4]", "--set", "seeds=[0,1]",
                                      "--set", "backbone_epochs=1", "--set", "finetune_epochs=2", "-o", str(out)])
    torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return out / "models"


@pytest.fixture(scope="module")
def vae(zoo, tmp_path_factory):
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("mv") / "vae"
    result = CliRunner().invoke(app, ["merge", "latent", "train", "-m", str(zoo), "--target", str(zoo / "w8-s0-5to9"),
                                      "--stage1-steps", "20", "--stage2-steps", "10", *TINY_VAE, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_zoo_and_vae_training_write_run_json(zoo, vae):
    assert sorted(p.name for p in zoo.iterdir())[:2] == ["w4-s1-0to4", "w4-s1-0to4-ep1"]
    record = json.loads((vae / "run.json").read_text())
    assert record["status"] == "ok" and set(record["metrics"]["vae_recon_rel_err"]) == {"stage1", "stage2"}
    meta = json.loads((vae / "vae.json").read_text())
    assert meta["target"].endswith("w8-s0-5to9") and meta["stages"] == [1, 2]


def test_latent_merge_across_widths_end_to_end(cli, zoo, vae, tmp_path):
    out = tmp_path / "merged"
    r = cli(["merge", "latent", "run", "--vae", str(vae), "-m", f"{zoo / 'w4-s1-0to4'},{zoo / 'w8-s0-5to9'}",
             "--weights", "0.5,0.5", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert {"acc_union", "acc_task_a", "acc_task_b"} <= set(record["metrics"])
    from toolkit.merge.models import load_for_merge

    merged = load_for_merge(str(out / "model"))
    assert merged.arch["sizes"] == [64, 8, 8, 10]
    assert merged.metadata["weight_space_average"] == ["layers.0.bias", "layers.1.bias", "layers.2.bias"]
    assert merged.metadata["residual"] is True


def test_latent_merge_residual_flag_end_to_end(cli, zoo, vae, tmp_path):
    from toolkit.merge.models import load_for_merge

    a, b = zoo / "w8-s0-0to4", zoo / "w8-s0-5to9"
    states = {}
    for flag in ("--residual", "--no-residual"):
        out = tmp_path / flag.strip("-")
        r = cli(["merge", "latent", "run", "--vae", str(vae), "-m", f"{a},{b}", "--weights", "1,0", flag,
                 "-o", str(out)])
        assert r.exit_code == 0, r.stderr
        states[flag] = load_for_merge(str(out / "model")).state
    parent = load_for_merge(str(a)).state
    assert all(torch.equal(states["--residual"][n], parent[n]) for n in parent)
    assert not torch.allclose(states["--no-residual"]["layers.0.weight"], parent["layers.0.weight"], atol=1e-4)


def test_weight_space_baselines_end_to_end(cli, zoo, tmp_path, device_args):
    pair = f"{zoo / 'w8-s0-0to4'},{zoo / 'w8-s0-5to9'}"
    base = str(zoo / "w8-s0-backbone")
    for args in (["average", "-m", pair], ["task-arithmetic", "-m", pair, "--base", base, "--scaling", "0.5"],
                 ["ties", "-m", pair, "--base", base, "--density", "0.5"],
                 ["padded", "-m", f"{zoo / 'w4-s1-0to4'},{zoo / 'w8-s0-5to9'}", "--align"]):
        out = tmp_path / args[0]
        r = cli(["merge", *args, *device_args, "-o", str(out)])
        assert r.exit_code == 0, (args[0], r.stderr)
        assert (out / "run.json").is_file() and (out / "model" / "model.safetensors").is_file()
    from toolkit.merge.models import load_for_merge

    avg = load_for_merge(str(tmp_path / "average" / "model")).state["layers.0.weight"]
    one, two = (load_for_merge(str(zoo / n)).state["layers.0.weight"] for n in ("w8-s0-0to4", "w8-s0-5to9"))
    assert torch.allclose(avg, (one + two) / 2)


def test_vae_train_resume_skips_finished_stages(zoo, tmp_path):
    from toolkit.core.context import RunContext
    from toolkit.merge.latent import LatentTrainConfig, run_train

    config = LatentTrainConfig(models=[str(zoo / "w8-s0-0to4"), str(zoo / "w8-s0-5to9")], stage1_steps=6,
                               stage2_steps=0, d_model=16, heads=2, encoder_layers=1, decoder_layers=1, latent_dim=16,
                               window=4, compression=2, batch_size=8, checkpoint_every=4)
    first = RunContext(out=tmp_path, quiet=True)
    run_train(config, first)
    weights = (tmp_path / "vae.safetensors").read_bytes()
    assert (tmp_path / "checkpoints" / "vae_train.pt").is_file()
    (tmp_path / "vae.safetensors").unlink()
    resumed = RunContext(out=tmp_path, quiet=True, resume=True, seed=7)
    run_train(config, resumed)
    assert (tmp_path / "vae.safetensors").read_bytes() == weights
    assert resumed.metrics["vae_recon_rel_err"] == first.metrics["vae_recon_rel_err"]


def test_bad_inputs_exit_2_with_one_line(cli, zoo, vae, tiny_gpt2_dir, tmp_path):
    small, big = str(zoo / "w4-s1-0to4"), str(zoo / "w8-s0-5to9")
    nan_dir = tmp_path / "nan"
    from toolkit.merge.models import load_for_merge, save_plain

    broken = load_for_merge(big)
    broken.state["layers.0.weight"][0, 0] = float("nan")
    save_plain(broken, nan_dir)
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        "empty model list": ["merge", "average", "-m", ","],
        "incompatible families": ["merge", "average", "-m", f"{big},{tiny_gpt2_dir}"],
        "different sizes": ["merge", "average", "-m", f"{small},{big}"],
        "NaN": ["merge", "average", "-m", f"{big},{nan_dir}"],
        "not found": ["merge", "average", "-m", f"{big},{tmp_path / 'missing'}"],
        "other shapes": ["merge", "latent", "run", "--vae", str(vae), "-m", f"{small},{big}", "--target", small],
        "not a VAE directory": ["merge", "latent", "run", "--vae", str(empty), "-m", f"{big},{big}"],
        "--weights expects comma-separated numbers": ["merge", "average", "-m", f"{big},{big}", "--weights", "a,b"],
        "2 merge weights": ["merge", "average", "-m", f"{big},{big},{big}", "--weights", "1,2"],
        "density": ["merge", "ties", "-m", f"{big},{big}", "--base", big, "--density", "1.5"],
    }
    for expected, args in cases.items():
        out = tmp_path / ("out-" + str(abs(hash(expected))))
        r = cli([*args, "-o", str(out)])
        assert r.exit_code == 2, (expected, r.exit_code, r.stderr)
        assert expected.lower() in r.stderr.lower(), (expected, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_hf_models_merge_and_reload_with_from_pretrained(cli, tiny_gpt2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "gpt2-avg"
    r = cli(["merge", "average", "-m", f"{tiny_gpt2_dir},{tiny_gpt2_dir}", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    original = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir)
    assert all(torch.equal(a, b) for a, b in zip(merged.state_dict().values(), original.state_dict().values()))
    assert merged.config.iclrkit["technique"] == "merge.average"


def test_latent_merge_of_hf_models_saves_an_hf_model(cli, tiny_gpt2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    vae, out = tmp_path / "vae", tmp_path / "merged"
    pair = f"{tiny_gpt2_dir},{tiny_gpt2_dir}"
    r = cli(["merge", "latent", "train", "-m", pair, "--stage1-steps", "3", "--stage2-steps", "2", *TINY_VAE,
             "-o", str(vae)])
    assert r.exit_code == 0, r.stderr
    r = cli(["merge", "latent", "run", "--vae", str(vae), "-m", pair, "--interpolation", "slerp", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    assert merged.config.iclrkit["weight_space_average"][0].endswith("bias")
    assert all(torch.isfinite(t).all() for t in merged.state_dict().values())


def test_cnn_zoo_merges_across_widths_with_channel_matching(cli, tmp_path):
    zoo_dir = tmp_path / "cnn"
    r = cli(["merge", "zoo", "--set", "kind=cnn", "--set", "widths=[4,2]", "--set", "seeds=[0,1]",
             "--set", "backbone_epochs=1", "--set", "finetune_epochs=1", "-o", str(zoo_dir)])
    assert r.exit_code == 0, r.stderr
    models = zoo_dir / "models"
    pair = f"{models / 'c4-s0-0to4'},{models / 'c4-s0-5to9'}"
    r = cli(["merge", "average", "-m", pair, "-o", str(tmp_path / "avg"), "--json"])
    assert r.exit_code == 0, r.stderr
    metrics = json.loads(r.stdout)["metrics"]
    assert {"acc_union", "acc_task_a", "acc_task_b"} <= set(metrics) and 0 <= metrics["acc_union"] <= 100
    from toolkit.merge.digits import net_from_state
    from toolkit.merge.models import load_for_merge

    merged = load_for_merge(str(tmp_path / "avg" / "model"))
    assert merged.family == "digits-cnn" and net_from_state(merged.family, merged.arch, merged.state)(
        torch.zeros(3, 64)).shape == (3, 10)
    # a 2-channel CNN projected into the 4-channel layout (channels weight-matched) and merged
    mixed = f"{models / 'c2-s1-0to4'},{models / 'c4-s0-5to9'}"
    r = cli(["merge", "padded", "-m", mixed, "--target", str(models / "c4-s0-5to9"), "--align",
             "-o", str(tmp_path / "aligned"), "--json"])
    assert r.exit_code == 0, r.stderr
    aligned = load_for_merge(str(tmp_path / "aligned" / "model"))
    assert aligned.arch["channels"] == 4 and 0 <= json.loads(r.stdout)["metrics"]["acc_union"] <= 100


def test_gpt2_lm_zoo_and_mixed_width_merges(cli, text_file, tmp_path):
    from transformers import AutoModelForCausalLM

    config = tmp_path / "lm.yaml"
    config.write_text(f"tasks: {{a: {{train: {text_file}}}, b: {{train: embedded}}}}\nwidths: [8, 16]\nseeds: [0, 1]\n"
                      "heads: 2\nvocab: 300\ncontext: 32\nseqlen: 16\nbatch: 4\nbackbone_steps: 4\n"
                      "finetune_steps: 4\nsnapshot_every: 2\nheldout_chars: 2000\nscore_windows: 4\n")
    zoo_dir = tmp_path / "lmzoo"
    r = cli(["merge", "lm-zoo", "-o", str(zoo_dir)])
    assert r.exit_code == 2 and "tasks" in r.stderr and not zoo_dir.exists()
    r = cli(["merge", "lm-zoo", "--config", str(config), "-o", str(zoo_dir)])
    assert r.exit_code == 0, r.stderr
    models = zoo_dir / "models"
    assert (models / "g8-s0-a-step2" / "heldout.txt").is_file() and not (models / "g8-s0-a-step4").exists()
    small, big = models / "g8-s0-a", models / "g16-s1-b"
    r = cli(["merge", "padded", "-m", f"{small},{big}", "--target", str(big), "--align", "-o",
             str(tmp_path / "widened"), "--json"])
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert {"acc_task_a", "acc_task_b", "acc_union", "ppl_task_a", "ppl_task_b", "ppl_union"} <= set(record["metrics"])
    assert record["baselines"]["parent0"]["ppl_task_a"] > 1
    vae, out = tmp_path / "vae", tmp_path / "latent"
    r = cli(["merge", "latent", "train", "-m", str(models), "--target", str(big), "--stage1-steps", "2",
             "--stage2-steps", "2", *TINY_VAE, "-o", str(vae)])
    assert r.exit_code == 0, r.stderr
    r = cli(["merge", "latent", "run", "--vae", str(vae), "-m", f"{small},{big}", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    merged = AutoModelForCausalLM.from_pretrained(out / "model")
    assert merged.config.n_embd == 16 and merged.lm_head.weight is merged.transformer.wte.weight
    assert json.loads(r.stdout)["metrics"]["ppl_union"] > 1
    r = cli(["merge", "latent", "run", "--vae", str(vae), "-m", f"{small},{big}", "--target", str(small),
             "-o", str(tmp_path / "narrow")])
    assert r.exit_code == 2 and "integer factor" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def shallow_zoo(tmp_path_factory):
    """One-hidden-layer MLPs of width 4 (the main zoo has two hidden layers of width 4 and 8)."""
    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path_factory.mktemp("ms") / "zoo"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    result = CliRunner().invoke(app, ["merge", "zoo", "--set", "widths=[4]", "--set", "seeds=[1]", "--set", "depth=1",
                                      "--set", "backbone_epochs=1", "--set", "finetune_epochs=1", "-o", str(out)])
    torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return out / "models"


def test_mixed_depth_merges_deepen_into_the_target_layout(cli, zoo, vae, shallow_zoo, tmp_path):
    from toolkit.merge.models import load_for_merge

    shallow, big = str(shallow_zoo / "w4-s1-0to4"), str(zoo / "w8-s0-5to9")
    assert load_for_merge(shallow).arch["sizes"] == [64, 4, 10]
    depths = {"target": 2, "parent0": 1, "parent1": 2}
    for name, args in {"padded": ["merge", "padded", "-m", f"{shallow},{big}", "--target", big, "--align"],
                       "latent": ["merge", "latent", "run", "--vae", str(vae), "-m", f"{shallow},{big}"]}.items():
        out = tmp_path / name
        r = cli([*args, "-o", str(out), "--json"])
        assert r.exit_code == 0, r.stderr
        assert json.loads((out / "run.json").read_text())["metrics"]["depths"] == depths
        assert 0 <= json.loads(r.stdout)["metrics"]["acc_union"] <= 100
        assert load_for_merge(str(out / "model")).arch["sizes"] == [64, 8, 8, 10]
    for expected, args in {"never drops layers": ["merge", "padded", "-m", f"{big},{shallow}", "--target", shallow,
                                                  "--align"],
                           "different parameter names": ["merge", "average", "-m", f"{shallow},{big}"]}.items():
        out = tmp_path / "refused"
        r = cli([*args, "-o", str(out)])
        assert r.exit_code == 2 and expected in r.stderr, (expected, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


def test_gpt2_deepened_through_the_cli_reloads_with_the_same_logits(cli, tiny_gpt2_dir, tmp_path):
    """Merging a 2-block GPT-2 with itself into a 3-block target layout returns the deepened model itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

    original = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    deeper_dir = tmp_path / "deeper"
    GPT2LMHeadModel(type(original.config)(**{**original.config.to_dict(), "n_layer": 3})).save_pretrained(deeper_dir)
    AutoTokenizer.from_pretrained(tiny_gpt2_dir).save_pretrained(deeper_dir)
    out = tmp_path / "merged"
    r = cli(["merge", "padded", "-m", f"{tiny_gpt2_dir},{tiny_gpt2_dir}", "--target", str(deeper_dir), "--align",
             "-o", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["metrics"]["depths"] == {"target": 3, "parent0": 2, "parent1": 2}
    merged = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    assert merged.config.n_layer == 3
    ids = torch.randint(0, original.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, original(ids).logits, atol=1e-5)
