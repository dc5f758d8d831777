"""One rank of a gradient-lending launch (under torchrun): trains a stack of Linear layers whose
weights are each alone in their units (large enough to be reduced without a bucket), for every
stage x accumulation of --runs, once lending autograd's gradient tensors to the engine
(zero_engine_grad_lend) and once copying them (engine._lend_grads off). Per run
STAGE-GAS[-BUCKET]-MODE under OUT (BUCKET: a reduce_bucket_size, so that with overlap_comm the
older lone units are reduced by a collective during backward and only the newest are left to the
step):
  NAME.safetensors   rank 0: every parameter's fp32 master value (engine.gather_master)
  NAME.rank<R>.json  every rank: how many gradients were lent, in all and in the boundary's
                     micro-steps
Any exception: OUT/error.rank<R>.json (type, message), exit 1.

  worker_lend.py --out OUT --runs 0:1,1:2,3:1:70000,...
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

from worker_common import errors_reported, rank_args

WIDTH, STEPS, SEED = 256, 3, 5
LENT = 3  # gradients a micro-step lends: the three WIDTH x WIDTH weights, each alone in its unit


def run_name(stage, gas, bucket):
    """STAGE-GAS[-BUCKET]: a run's files are NAME-lent.* and NAME-copied.*."""
    return f"{stage}-{gas}-{bucket}" if bucket else f"{stage}-{gas}"


def make_model():
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(),
                               torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(WIDTH, 16))


def run_one(zero, out, rank, stage, gas, bucket, lend):
    from safetensors.torch import save_file

    model = make_model()
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": stage}}
    if bucket:
        config["zero_optimization"].update(reduce_bucket_size=bucket, overlap_comm=True)
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=config)
    engine._lend_grads = lend
    g = torch.Generator().manual_seed(100 + rank)
    lent_at_boundary = 0
    for _ in range(STEPS):
        for micro in range(gas):
            x, y = torch.randn(4, WIDTH, generator=g), torch.randn(4, 16, generator=g)
            before = engine.timings()["python"]["grads_lent"]
            engine.backward(F.mse_loss(engine(x), y))
            if micro == gas - 1:
                lent_at_boundary += engine.timings()["python"]["grads_lent"] - before
            engine.step()
    assert engine.global_steps == STEPS, engine.global_steps
    master = {n: engine.gather_master(n) for n, _ in engine.module.named_parameters()}
    name = f"{run_name(stage, gas, bucket)}-{'lent' if lend else 'copied'}"
    if rank == 0:
        save_file(master, os.path.join(out, name + ".safetensors"))
    with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
        json.dump({"lent": engine.timings()["python"]["grads_lent"],
                   "lent_at_boundary": lent_at_boundary}, f)
    engine.close()


def main():
    args, rank, _ = rank_args("out", "runs")
    with errors_reported(args.out, rank):
        import zero

        for run in args.runs.split(","):
            stage, gas, *bucket = map(int, run.split(":"))
            for lend in (True, False):
                run_one(zero, args.out, rank, stage, gas, bucket[0] if bucket else 0, lend)


if __name__ == "__main__":
    sys.exit(main())
