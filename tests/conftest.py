"""Shared fixtures: tiny models built in-process from configs (no downloads), an isolated zoo cache, a CLI runner,
and the suite's device switch: ICLRKIT_TEST_DEVICE=cuda (default cpu) reruns the CLI / integration tests that take
`device_args` (compress, edit, unlearn, remove-ln, merge, segment) on that device."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TEST_DEVICE = os.environ.get("ICLRKIT_TEST_DEVICE", "cpu").strip() or "cpu"


def test_device_name() -> str:
    """The device the suite runs its device-switched tests on; a CUDA request without a CUDA device fails loudly
    (a GPU rerun that silently ran on the CPU would prove nothing)."""
    if TEST_DEVICE.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.fail(f"ICLRKIT_TEST_DEVICE={TEST_DEVICE} but torch sees no CUDA device", pytrace=False)
    elif TEST_DEVICE != "cpu":
        pytest.fail(f"ICLRKIT_TEST_DEVICE must be cpu or cuda[:N], got {TEST_DEVICE!r}", pytrace=False)
    return TEST_DEVICE


@pytest.fixture(scope="session")
def test_device() -> str:
    return test_device_name()


@pytest.fixture(scope="session")
def device_args(test_device) -> list[str]:
    """`--device <ICLRKIT_TEST_DEVICE>` for a CLI invocation: cli([..., *device_args])."""
    return ["--device", test_device]


@pytest.fixture(scope="session", autouse=True)
def isolated_zoo(tmp_path_factory):
    """Tests never read or write the user's zoo cache, nor iclrkit's own cache (edit statistics, converted GGUF)."""
    path = tmp_path_factory.mktemp("zoo")
    saved = {name: os.environ.get(name) for name in ("ICLRKIT_ZOO_DIR", "ICLRKIT_CACHE_DIR")}
    os.environ["ICLRKIT_ZOO_DIR"] = str(path)
    os.environ["ICLRKIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("iclrkit-cache"))
    yield path
    for name, old in saved.items():
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@pytest.fixture(autouse=True)
def in_scratch_directory(tmp_path, monkeypatch):
    """Every test runs in its own scratch directory, as a user runs iclrkit from a project folder: the inputs a test
    writes there (tmp_path/forget.json) sit in the working directory, which claims no folder, so its outputs may go
    to tmp_path/out (`-d valid.txt -o runs/x`). An input written anywhere else protects its folder from --out, as
    tests/cli/test_hardening_round3.py and the bad-input matrix check."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from toolkit.data.text import embedded_text
    from toolkit.zoo.lm import train_tokenizer

    return train_tokenizer(embedded_text()[:200_000], vocab_size=300)


def _save(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """An untrained 2-block GPT-2 (LayerNorm, Conv1D) saved as an HF directory."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tiny_tokenizer), n_positions=128, n_embd=32, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    return _save(GPT2LMHeadModel(config).eval(), tiny_tokenizer, tmp_path_factory.mktemp("gpt2") / "model")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """An untrained 2-block Llama (RMSNorm, RoPE, SwiGLU, GQA) saved as an HF directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=0, eos_token_id=0)
    return _save(LlamaForCausalLM(config).eval(), tiny_tokenizer, tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture()
def cli():
    """Invoke the iclrkit CLI in-process: cli(["eval", "ppl", ...]) -> Result (exit_code, stdout, stderr)."""
    from typer.testing import CliRunner

    runner = CliRunner()

    def invoke(args: list[str], **kwargs):
        import cli.main  # looked up per call: a test that rebuilds the CLI (testkit.throwaway_method) sees its app

        return runner.invoke(cli.main.app, [str(a) for a in args], catch_exceptions=False, **kwargs)

    return invoke


@pytest.fixture()
def text_file(tmp_path) -> Path:
    """A text file in a folder of its own (tmp_path/data): --out never goes into an input file's folder, so outputs
    at tmp_path/NAME stay legal."""
    from toolkit.data.text import embedded_text

    path = tmp_path / "data" / "text.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(embedded_text()[:40_000])
    return path


@pytest.fixture()
def one_thread():
    """One intra-op thread for tiny models: extra threads only contend on a shared 2-core CPU (often 10x slower).
    Opt in per module with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def bench_data(tmp_path_factory) -> Path:
    """`iclrkit bench fixtures`' synthetic VideoMathQA and MMSearch-Plus sets, written once per session."""
    from toolkit.bench import fixtures

    root = tmp_path_factory.mktemp("bench-fx")
    fixtures.write_videomathqa(root / "videomathqa")
    fixtures.write_mmsearch(root / "mmsearch")
    return root


@pytest.fixture()
def sharded_llama(tmp_path, tiny_tokenizer) -> Path:
    """A 3-block tiny Llama saved in several safetensors shards (with model.safetensors.index.json)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=0, eos_token_id=0)
    path = tmp_path / "llama"
    LlamaForCausalLM(config).eval().save_pretrained(path, max_shard_size="20KB")
    tiny_tokenizer.save_pretrained(path)
    assert (path / "model.safetensors.index.json").is_file()
    return path
