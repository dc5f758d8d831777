"""One rank of an accumulation launch (under torchrun): trains cases.RecurrentLM with zero for
every accumulation x dtype x stage of --runs and writes, per run GAS-DTYPE-STAGE, under OUT:
  NAME.safetensors   rank 0: every parameter's fp32 master value (engine.gather_master)
  NAME.rank<R>.json  every rank: the micro-batch losses
`aux` runs in the window's even micro-batches only, so it has no gradient in the others.
Any exception: OUT/error.rank<R>.json (type, message), exit 1.

  worker_accum.py --out OUT --runs 2:fp32:0,2:fp32:1,...
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import cases
from worker_common import errors_reported, rank_args

DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def run_one(zero, out, rank, world, gas, dtype, stage):
    from safetensors.torch import save_file

    torch.manual_seed(cases.ACCUM_SEED)
    model = cases.RecurrentLM()
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(),
                                      config=cases.accum_config(stage, dtype, gas))
    losses = []
    for step in range(cases.ACCUM_STEPS):
        for micro in range(gas):
            x, y = cases.accum_batch(step, micro, rank, world)
            logits = engine(x, use_aux=micro % 2 == 0)
            loss = F.cross_entropy(logits.float().reshape(-1, cases.R_VOCAB), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    assert engine.global_steps == cases.ACCUM_STEPS, engine.global_steps
    master = {n: engine.gather_master(n) for n, _ in engine.module.named_parameters()}
    name = f"{gas}-{dtype}-{stage}"
    if rank == 0:
        save_file(master, os.path.join(out, name + ".safetensors"))
    with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
        json.dump({"losses": losses}, f)
    engine.close()


def main():
    args, rank, world = rank_args("out", "runs")
    with errors_reported(args.out, rank):
        import zero

        for run in args.runs.split(","):
            gas, dtype, stage = run.split(":")
            run_one(zero, args.out, rank, world, int(gas), dtype, int(stage))


if __name__ == "__main__":
    sys.exit(main())
