"""One rank of the GatheredParameters(modifier_rank=...) launch (under torchrun): for each stage x
dtype, trains the MLP (or --model) for MODIFY_AT steps, replaces every parameter inside
zero.GatheredParameters(params, modifier_rank=M) — rank M writes cases.replacement(), every other
rank writes zeros, which must not count — and trains on to STEPS.

  worker_modify.py --out OUT [--runs 0:fp32,3:bf16,...] [--model mlp|transformer]

It writes under OUT, per run S-D:
  S-D.master.safetensors   rank 0: the final fp32 master weights (zero_to_fp32 of a checkpoint)
  S-D.rank<R>.json         every rank: the largest difference between the replacement (rounded to
                           the training dtype) and what the module showed / the engine's master
                           held right after the context, the modifier rank, and the bytes its
                           steps wrote into a model copy the ranks share
Any exception: OUT/error.rank<R>.json (type, message), exit 1.
"""
import argparse
import os
import sys
import traceback

import torch

import cases
from worker_train import DTYPE, write_json

MODEL = "mlp"
MODIFY_AT = 3
STEPS = 6


def train(engine, steps, rank, world, dtype, model=MODEL):
    for step in steps:
        x, y = cases.rank_batch(model, step, rank, world)
        engine.backward(cases.loss_fn(model, engine(cases.model_input(x, DTYPE[dtype])), y))
        engine.step()


def largest_difference(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def run_one(zero, out, rank, world, stage, dtype, model_name=MODEL):
    from safetensors.torch import save_file
    from zero.utils import get_fp32_state_dict_from_zero_checkpoint

    name = f"{stage}-{dtype}"
    model = cases.build(model_name)
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(),
                                      config=cases.config(stage, dtype, world))
    train(engine, range(MODIFY_AT), rank, world, dtype, model_name)

    modifier = world - 1
    new = cases.replacement(model_name)
    params = dict(engine.module.named_parameters())
    with zero.GatheredParameters(list(params.values()), modifier_rank=modifier):
        with torch.no_grad():
            for n, p in params.items():
                if rank == modifier:
                    p.copy_(new[n])
                else:
                    p.zero_()
    expected = {n: v.to(DTYPE[dtype]).float() for n, v in new.items()}
    with zero.GatheredParameters(list(params.values())):
        shown = {n: p.detach().float().clone() for n, p in params.items()}
    master = {n: engine.gather_master(n) for n in params}
    info = {"modifier": modifier, "module_vs_replacement": largest_difference(shown, expected),
            "master_vs_replacement": largest_difference(master, expected)}

    train(engine, range(MODIFY_AT, STEPS), rank, world, dtype, model_name)
    info["shared_model_bytes"] = engine.timings()["shared_model_bytes"]
    ckpt = os.path.join(out, "ckpt", name)
    engine.save_checkpoint(ckpt, tag="end")
    if rank == 0:
        sd = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="end")
        save_file({k: v.contiguous() for k, v in sd.items()},
                  os.path.join(out, name + ".master.safetensors"))
    write_json(os.path.join(out, f"{name}.rank{rank}.json"), info)
    engine.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--model", choices=sorted(cases.MODELS), default=MODEL)
    p.add_argument("--runs", default=",".join(f"{s}:{d}" for d in ("fp32", "bf16")
                                              for s in cases.STAGES))
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    try:
        import zero

        for run in args.runs.split(","):
            stage, dtype = run.split(":")
            run_one(zero, args.out, rank, world, int(stage), dtype, args.model)
    except Exception as e:  # noqa: BLE001 - reported to the test, which names the rank
        write_json(os.path.join(args.out, f"error.rank{rank}.json"),
                   {"type": type(e).__name__, "message": str(e), "trace": traceback.format_exc()})
        sys.exit(1)


if __name__ == "__main__":
    main()
