"""One rank of a ZeRO++/MiCS launch (under torchrun, ZERO_RANKS_PER_NODE set by the test): trains
cases.<model> at stage 3 in fp32 once per named zero_optimization variant, each with a fresh
engine and a freshly seeded model, and writes to OUT:

  NAME.module.safetensors   rank 0: engine.module's parameters, gathered
  NAME.rank<R>.json         every rank: losses, the engine's byte counts and gathers per step

  worker_zeropp.py --model M --out OUT --variants NAME=JSON;NAME=JSON...
Any exception: OUT/error.rank<R>.json (type, message), exit 1.
"""
import argparse
import gc
import json
import os
import sys
import traceback

import torch

import cases


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)


def run_one(zero, args, rank, world, name, extra):
    from safetensors.torch import save_file

    model = cases.build(args.model)
    cfg = cases.config(3, "fp32", world)
    cfg["zero_optimization"].update(extra)
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    losses = []
    engine.timings(reset=True)
    for step in range(cases.STEPS):
        x, y = cases.rank_batch(args.model, step, rank, world)
        loss = cases.loss_fn(args.model, engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    t = engine.timings()
    info = {"losses": losses, "intra_node_bytes": t["intra_node_bytes"] / cases.STEPS,
            "inter_node_bytes": t["inter_node_bytes"] / cases.STEPS,
            "gathers": t["gathers"], "secondary_gathers": t["secondary_gathers"]}
    params = list(engine.module.parameters())
    with zero.GatheredParameters(params, modifier_rank=None):
        module_sd = {k: v.detach().clone().contiguous() for k, v in engine.module.state_dict().items()}
    if rank == 0:
        save_file(module_sd, os.path.join(args.out, name + ".module.safetensors"))
    write_json(os.path.join(args.out, f"{name}.rank{rank}.json"), info)
    engine.close()
    del engine, model
    gc.collect()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(cases.MODELS), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--variants", required=True)
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    try:
        import zero

        for spec in args.variants.split(";"):
            name, extra = spec.split("=", 1)
            run_one(zero, args, rank, world, name, json.loads(extra))
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the test, then re-raised
        write_json(os.path.join(args.out, f"error.rank{rank}.json"),
                   {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()})
        raise


if __name__ == "__main__":
    sys.exit(main())
