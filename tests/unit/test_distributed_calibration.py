"""Distributed calibration: 2 gloo processes on CPU (windows split, Hessian sums and counts all-reduced, solves
shared out and broadcast, rank 0 writes) give the Hessians and the compressed model of one process."""

import torch
import torch.multiprocessing as mp

from toolkit.linalg.hessian import HessianAccumulator


def _on_block(record):
    from toolkit.compress.quant import fit_weight_scale
    from toolkit.compress.solvers import damp_hessian, gptq
    from toolkit.nn.distributed import shared_solves

    def on_block(step):
        for group in step.layout.groups:
            tap, = step.group_hessians([group])
            acc = tap.accumulators()[group.names[0]]
            acc.all_reduce()
            record[f"{step.index}.{group.names[0]}"] = acc.H.clone()
            record[f"{step.index}.{group.names[0]}.count"] = torch.tensor(acc.count)

            def job(slot):
                W = slot.weight(step.block).double()
                return gptq(W, damp_hessian(acc.H), fit_weight_scale(W, 4, mse=False), 4).float()

            weights = [slot.weight(step.block) for slot in group.slots]
            solved = shared_solves([(lambda s=s: job(s), w.contiguous()) for s, w in zip(group.slots, weights)])
            for slot, new in zip(group.slots, solved):
                slot.set_weight(step.block, new)
    return on_block


def _calibrate(source, out, windows, record_path):
    from safetensors.torch import save_file

    from toolkit.models.lazy import LazyModel
    from toolkit.nn.pipeline import run_sequential_onloaded

    lazy = LazyModel(source)
    record = {}
    run_sequential_onloaded(lazy, windows, _on_block(record), out_dir=out)
    save_file({k: v.contiguous() for k, v in record.items()}, str(record_path))


def _worker(rank, world, init, source, out, windows, record_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        _calibrate(source, out, windows, record_dir / f"rank{rank}.safetensors")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process(tmp_path):
    from safetensors.torch import load_file
    from test_onload import _read_dir, save_sharded

    source = save_sharded("llama", tmp_path / "src")
    windows = torch.randint(0, 96, (6, 16), generator=torch.Generator().manual_seed(3))
    _calibrate(source, tmp_path / "one", windows, tmp_path / "one.safetensors")
    records = tmp_path / "records"
    records.mkdir()
    mp.spawn(_worker, args=(2, f"file://{tmp_path / 'rendezvous'}", source, tmp_path / "two", windows, records),
             nprocs=2, join=True)

    one, two = load_file(str(tmp_path / "one.safetensors")), load_file(str(records / "rank0.safetensors"))
    other = load_file(str(records / "rank1.safetensors"))
    assert set(one) == set(two) and len(one) == 3 * 4 * 2
    for name in one:
        if name.endswith(".count"):
            assert int(two[name]) == int(one[name]) == 6 * 16  # every token counted once, across ranks
            continue
        assert torch.equal(two[name], other[name])  # ranks agree exactly after the all-reduce
        assert (two[name] - one[name]).norm() <= 1e-5 * one[name].norm(), name
    single, dist_out = _read_dir(tmp_path / "one"), _read_dir(tmp_path / "two")
    assert set(single) == set(dist_out)
    for name in single:
        assert (dist_out[name] - single[name]).norm() <= 1e-5 * max(single[name].norm(), 1e-12), name


def test_accumulator_all_reduce_is_a_no_op_in_one_process():
    acc = HessianAccumulator(3)
    x = torch.randn(5, 3, dtype=torch.float64)
    acc.add(x)
    before = acc.H.clone()
    acc.all_reduce()
    assert torch.equal(acc.H, before) and acc.count == 5
    assert torch.allclose(before, 2 * x.t() @ x / 5)
