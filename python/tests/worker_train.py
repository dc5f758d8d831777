"""One rank of a training launch (under torchrun): trains cases.<model> with zero once per config,
a fresh engine and a freshly seeded model each time, and writes what the tests compare to OUT.

  worker_train.py --model M --out OUT [--runs 0:fp32,3:bf16,...] [--save-mid S:D@STEP,...]
                  [--resume S:D@CKPT_DIR,...] [--persistence N] [--clip X] [--gas N]

For each run STAGE:DTYPE (default: every stage x every dtype) it writes under OUT:
  S-D.master.safetensors   rank 0: get_fp32_state_dict_from_zero_checkpoint of the final checkpoint
  S-D.module.safetensors   rank 0: engine.module's parameters, gathered (zero.GatheredParameters)
  S-D.rank<R>.json         every rank: losses, engine figures, parameter dtypes
  ckpt/S-D/                the final checkpoint (tag "end"); runs named by --save-mid write
                           ckpt/S-D-mid/ too (tag "mid", after STEP steps, client_state {"step": STEP})
Then each --resume loads CKPT_DIR (tag "mid", a checkpoint another launch saved with --save-mid,
at any world size and stage) into an engine of stage S and dtype D, trains on to cases.STEPS and
writes resume-S-D.* likewise. Any exception: OUT/error.rank<R>.json (type, message), exit 1.
"""
import argparse
import gc
import json
import os
import sys
import time
import traceback

import torch

import cases

DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def run_one(zero, args, rank, world, stage, dtype, load=None):
    from safetensors.torch import save_file
    from zero.utils import get_fp32_state_dict_from_zero_checkpoint

    name = f"{stage}-{dtype}" if load is None else f"resume-{stage}-{dtype}"
    started = time.monotonic()
    model = cases.build(args.model)
    cfg = cases.config(stage, dtype, world, cases.FP16_SCALE[args.model])
    if args.persistence is not None:  # stage3_param_persistence_threshold instead of cases'
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = args.persistence
    if args.clip is not None:  # gradient_clipping instead of cases' (0: none)
        cfg["gradient_clipping"] = args.clip
    if args.reduce_bucket is not None:  # reduce_bucket_size instead of cases' 5000
        cfg["zero_optimization"]["reduce_bucket_size"] = args.reduce_bucket
    if args.gas is not None:  # micro-steps a window instead of cases' 1 (each step() one of them)
        cfg["gradient_accumulation_steps"] = args.gas
        cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * world * args.gas
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    info = {"param_dtypes": sorted({str(p.dtype) for p in engine.module.parameters()}),
            "train_batch_size": engine.train_batch_size(),
            "micro_batch": engine.train_micro_batch_size_per_gpu(),
            "accumulation": engine.gradient_accumulation_steps(),
            "lr": engine.get_lr()}
    start = 0
    if load is not None:
        path, client_state = engine.load_checkpoint(load, tag="mid")
        start = client_state["step"]
        info.update(load_path=str(path), client_state=client_state, steps_after_load=engine.global_steps)
    losses, boundaries = [], []
    for step in range(start, cases.STEPS):
        x, y = cases.rank_batch(args.model, step, rank, world)
        loss = cases.loss_fn(args.model, engine(cases.model_input(x, DTYPE[dtype])), y)
        engine.backward(loss)
        boundaries.append(bool(engine.is_gradient_accumulation_boundary()))
        engine.step()
        losses.append(loss.item())
        if args.save_mid.get(name) == step + 1:
            engine.save_checkpoint(os.path.join(args.out, "ckpt", name + "-mid"), tag="mid",
                                   client_state={"step": step + 1})
    info.update(losses=losses, boundaries=boundaries, global_steps=engine.global_steps,
                train_seconds=time.monotonic() - started,
                pushed_bytes=engine.timings()["pushed_bytes"],
                shared_model_bytes=engine.timings()["shared_model_bytes"],
                units_fused=engine.timings()["units_fused"],
                units_stepped_in_backward=engine.timings()["units_stepped_in_backward"],
                units_alone=engine.timings()["units_alone"],
                gathers=engine.timings()["gathers"])
    ckpt = os.path.join(args.out, "ckpt", name)
    engine.save_checkpoint(ckpt, tag="end", client_state={"step": cases.STEPS})
    params = list(engine.module.parameters())
    with zero.GatheredParameters(params, modifier_rank=None):
        module_sd = {k: v.detach().clone().contiguous() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        save_file(module_sd, os.path.join(args.out, name + ".module.safetensors"))
        master = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="end")
        # Tied names hold one tensor; safetensors refuses shared storage, so each gets its own copy.
        save_file({k: v.detach().clone().contiguous() for k, v in master.items()},
                  os.path.join(args.out, name + ".master.safetensors"))
    write_json(os.path.join(args.out, f"{name}.rank{rank}.json"), info)
    del engine, model
    gc.collect()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(cases.MODELS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--runs", default=",".join(f"{s}:{d}" for d in cases.DTYPES for s in cases.STAGES))
    p.add_argument("--save-mid", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--persistence", type=int)
    p.add_argument("--clip", type=float)
    p.add_argument("--gas", type=int)
    p.add_argument("--reduce-bucket", type=int)
    args = p.parse_args()
    args.save_mid = {spec.split("@")[0].replace(":", "-"): int(spec.split("@")[1])
                     for spec in args.save_mid.split(",") if spec}
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    try:
        import zero

        for run in filter(None, args.runs.split(",")):
            stage, dtype = run.split(":")
            run_one(zero, args, rank, world, int(stage), dtype)
        for spec in filter(None, args.resume.split(",")):
            run, ckpt = spec.split("@", 1)
            stage, dtype = run.split(":")
            run_one(zero, args, rank, world, int(stage), dtype, load=ckpt)
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the test, then re-raised
        write_json(os.path.join(args.out, f"error.rank{rank}.json"),
                   {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
        raise


if __name__ == "__main__":
    sys.exit(main())
