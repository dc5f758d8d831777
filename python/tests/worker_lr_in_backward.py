"""One rank of an lr launch (under torchrun): trains cases' transformer with zero at stage 1
(fp32, no clipping, every lone unit held to the end of backward, so that windows step during
backward) while the lr is written into the optimizer's param_groups at some point of each step,
and writes OUT/MODE.rank<R>.json (losses, each step's lr and count of units stepped in
backward, the warnings zero gave) and, on rank 0, OUT/MODE.safetensors (the fp32 masters).

  worker_lr_in_backward.py --out OUT --mode scheduler|before|between|between_once|after_once

scheduler:    a torch LambdaLR passed to initialize (the engine steps it after each step);
before:       the lr written before each forward;
between:      the lr written between backward() and step() at every step;
between_once: written there once, at step ONCE (a step that began during backward);
after_once:   the same value written right after step ONCE's step(): what between_once amounts to.
Any exception: OUT/error.rank<R>.json (type, message), exit 1.
"""
import json
import os
import warnings

import torch

import cases
from worker_common import errors_reported, rank_args

STEPS = 8
ONCE = 4


def schedule(step):
    return min(1.0, (step + 1) / 3) * (0.8 ** max(0, step - 3))


def run(zero, out, mode, rank, world):
    from safetensors.torch import save_file

    model = cases.build("transformer")
    cfg = cases.config(1, "fp32", world)
    cfg["gradient_clipping"] = 0.0
    cfg["zero_optimization"]["reduce_bucket_size"] = 10**7
    del cfg["optimizer"]  # the client optimizer's settings instead
    opt = torch.optim.AdamW(model.parameters(), lr=cases.LR, betas=cases.BETAS, eps=cases.EPS,
                            weight_decay=cases.WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if mode == "scheduler" else None
    engine, optimizer, _, _ = zero.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                              config=cfg)

    def write_lr(step):
        for g in optimizer.param_groups:
            g["lr"] = cases.LR * schedule(step)

    losses, lrs, stepped, caught = [], [], [], []
    for step in range(STEPS):
        if mode == "before":
            write_lr(step)
        x, y = cases.rank_batch("transformer", step, rank, world)
        loss = cases.loss_fn("transformer", engine(cases.model_input(x, torch.float32)), y)
        engine.backward(loss)
        if mode == "between" or (mode == "between_once" and step == ONCE):
            write_lr(step)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            engine.step()
        caught += [str(w.message) for w in seen if "zero:" in str(w.message)]
        if mode == "after_once" and step == ONCE:
            write_lr(step)
        losses.append(loss.item())
        lrs.append(engine._last_result.lr)
        stepped.append(engine.timings()["units_stepped_in_backward"])
    master = {n: engine.gather_master(n) for n, _ in engine.module.named_parameters()}
    if rank == 0:
        save_file(master, os.path.join(out, mode + ".safetensors"))
    with open(os.path.join(out, f"{mode}.rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "lrs": lrs, "stepped": stepped, "warnings": caught}, f)
    engine.close()


def main():
    args, rank, world = rank_args("out", "mode")
    with errors_reported(args.out, rank):
        import zero

        run(zero, args.out, args.mode, rank, world)


if __name__ == "__main__":
    main()
