"""`iclrkit compress obr|rtn|gptq|sparsegpt|sparsegpt-gptq|wanda`: joint quantization + sparsification on one shared
recipe."""

from __future__ import annotations

from typing import Annotated

import typer

from cli._options import (
    ConfigOpt,
    DataOpt,
    DeviceOpt,
    DryRunOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    OverwriteOpt,
    ResumeOpt,
    SeedOpt,
    SetOpt,
)
from cli._runner import Common, execute
from cli.compress_bench import EPILOG as BENCH_EPILOG
from cli.compress_bench import HELP as BENCH_HELP
from cli.compress_bench import bench

app = typer.Typer(no_args_is_help=True, help="Compress LLMs: OBR and its baselines (quantization + sparsity).")

EvalDataOpt = Annotated[str | None, typer.Option("--eval-data", help="Text for perplexity after compression.")]
WBitsOpt = Annotated[int | None, typer.Option("--w-bits", help="Weight bits (2-8; 16 = float).")]
ABitsOpt = Annotated[int | None, typer.Option("--a-bits", help="Activation bits, per token (2-8; 16 = off).")]
KvBitsOpt = Annotated[int | None, typer.Option("--kv-bits", help="KV-cache bits (2-8; 16 = off).")]
SparsityOpt = Annotated[float | None, typer.Option("--sparsity", help="Unstructured sparsity per row, [0, 1).")]
NmOpt = Annotated[str | None, typer.Option("--nm", help="N:M structured sparsity, e.g. 2:4 or 4:8.")]
NsamplesOpt = Annotated[int | None, typer.Option("--nsamples", help="Calibration windows.")]
SeqlenOpt = Annotated[int | None, typer.Option("--seqlen", help="Tokens per calibration window.")]
GroupSizeOpt = Annotated[int | None, typer.Option("--group-size", help="Input columns per weight scale "
                                                 "(e.g. 32, 64, 128); omit for one scale per output channel.")]
ActorderOpt = Annotated[str | None, typer.Option("--actorder", help="GPTQ column order: static (default: "
                                                 "decreasing Hessian diagonal) | weight (= static) | group (groups "
                                                 "follow the order; needs --group-size) | none.")]
RotateOpt = Annotated[bool | None, typer.Option("--rotate/--no-rotate",
                                                   help="QuaRot rotation (default: on for RMSNorm models).")]
EXAMPLES = ("Examples: iclrkit compress {cmd} --model zoo:llama-small --data valid.txt --eval-data test.txt "
            "--w-bits 4 --a-bits 4 --kv-bits 4 --sparsity 0.5 --out runs/{cmd} | add --dry-run for the plan, "
            "--resume to continue a killed run")


def _execute(technique: str, config_cls, flags: dict, common: Common) -> None:
    from toolkit.compress.recipe import plan, run_compress

    execute(technique=technique, config_cls=config_cls, flags=flags, common=common, run=run_compress,
            inputs={"data": flags.get("data"), "eval_data": flags.get("eval_data")}, plan=plan)


@app.command("obr", help="OBR: Optimal Brain Restoration (W4A4KV4 + 50% sparsity by default).",
             epilog=EXAMPLES.format(cmd="obr"))
def obr(model: ModelOpt, data: DataOpt = None, eval_data: EvalDataOpt = None, w_bits: WBitsOpt = None,
        a_bits: ABitsOpt = None, kv_bits: KvBitsOpt = None, sparsity: SparsityOpt = None, nm: NmOpt = None,
        group_size: GroupSizeOpt = None,
        alpha: Annotated[float | None, typer.Option(help="Share of columns whose quantization error is "
                                                            "compensated in closed form, [0, 1].")] = None,
        mode: Annotated[str | None, typer.Option(help="gptq (OBR_GPTQ) | rtn (OBR_RTN).")] = None,
        nsamples: NsamplesOpt = None, seqlen: SeqlenOpt = None, rotate: RotateOpt = None,
        out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None, seed: SeedOpt = None,
        device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False, json_: JsonOpt = False,
        overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
    from toolkit.compress.obr import ObrConfig

    flags = {"model": model, "data": data, "eval_data": eval_data, "w_bits": w_bits, "a_bits": a_bits,
             "kv_bits": kv_bits, "sparsity": sparsity, "nm": nm, "alpha": alpha, "mode": mode, "nsamples": nsamples,
             "seqlen": seqlen, "rotate": rotate, "group_size": group_size}
    _execute("compress.obr", ObrConfig, flags, Common.of(locals()))


def _baseline(name: str, help_text: str, config_name: str):
    @app.command(name, help=help_text, epilog=EXAMPLES.format(cmd=name))
    def command(model: ModelOpt, data: DataOpt = None, eval_data: EvalDataOpt = None, w_bits: WBitsOpt = None,
                a_bits: ABitsOpt = None, kv_bits: KvBitsOpt = None, sparsity: SparsityOpt = None, nm: NmOpt = None,
                group_size: GroupSizeOpt = None, nsamples: NsamplesOpt = None, seqlen: SeqlenOpt = None,
                rotate: RotateOpt = None, out: OutOpt = None, config: ConfigOpt = None, set_: SetOpt = None,
                seed: SeedOpt = None, device: DeviceOpt = None, dtype: DtypeOpt = None, dry_run: DryRunOpt = False,
                json_: JsonOpt = False, overwrite: OverwriteOpt = False, resume: ResumeOpt = False) -> None:
        from toolkit.compress import baselines

        flags = {"model": model, "data": data, "eval_data": eval_data, "w_bits": w_bits, "a_bits": a_bits,
                 "kv_bits": kv_bits, "sparsity": sparsity, "nm": nm, "nsamples": nsamples, "seqlen": seqlen,
                 "rotate": rotate, "group_size": group_size}
        _execute(f"compress.{name}", getattr(baselines, config_name), flags,
                 Common.of(locals()))

    return command


def _ordered_baseline(name: str, help_text: str, config_name: str):
    """A baseline whose GPTQ stage takes --actorder (gptq, sparsegpt-gptq)."""
    @app.command(name, help=help_text, epilog=EXAMPLES.format(cmd=name))
    def command(model: ModelOpt, data: DataOpt = None, eval_data: EvalDataOpt = None, w_bits: WBitsOpt = None,
                a_bits: ABitsOpt = None, kv_bits: KvBitsOpt = None, sparsity: SparsityOpt = None, nm: NmOpt = None,
                group_size: GroupSizeOpt = None, actorder: ActorderOpt = None, nsamples: NsamplesOpt = None,
                seqlen: SeqlenOpt = None, rotate: RotateOpt = None, out: OutOpt = None, config: ConfigOpt = None,
                set_: SetOpt = None, seed: SeedOpt = None, device: DeviceOpt = None, dtype: DtypeOpt = None,
                dry_run: DryRunOpt = False, json_: JsonOpt = False, overwrite: OverwriteOpt = False,
                resume: ResumeOpt = False) -> None:
        from toolkit.compress import baselines

        flags = {"model": model, "data": data, "eval_data": eval_data, "w_bits": w_bits, "a_bits": a_bits,
                 "kv_bits": kv_bits, "sparsity": sparsity, "nm": nm, "nsamples": nsamples, "seqlen": seqlen,
                 "rotate": rotate, "group_size": group_size, "actorder": actorder}
        _execute(f"compress.{name}", getattr(baselines, config_name), flags, Common.of(locals()))

    return command


_baseline("rtn", "Round-to-nearest weights (per channel, symmetric, MSE clip); --sparsity adds a magnitude mask.",
          "RtnConfig")
_ordered_baseline("gptq", "GPTQ weight quantization on the same pipeline (activation ordering on); --sparsity "
                  "adds a fixed mask.", "GptqConfig")
_baseline("sparsegpt", "SparseGPT pruning with joint GPTQ quantization, one pass (50% by default).",
          "SparsegptConfig")
_ordered_baseline("sparsegpt-gptq", "Two-stage baseline: SparseGPT pruning (50% by default), scales refit on the "
                  "sparse weights, then GPTQ keeping the mask (llm-compressor's SparseGPT -> GPTQ).",
                  "SparsegptGptqConfig")
_baseline("wanda", "Wanda pruning (|W|·‖x‖) followed by RTN (50% by default).", "WandaConfig")

app.command("bench", help=BENCH_HELP, epilog=BENCH_EPILOG)(bench)
