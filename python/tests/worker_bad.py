"""One rank of a run given bad input on purpose: worker_bad.py CASE OUT

Writes OUT/result.rank<R>.json: {"outcome": "error", "type", "is_zero_error", "message", "time"}
when zero raised (then exits 1), or {"outcome": "finished"} when nothing did (exit 0). Times are
time.time(), so a test can tell how long a rank took to notice a peer that died.
"""
import json
import os
import sys
import time
import traceback

import torch

import cases

CASE, OUT = sys.argv[1], sys.argv[2]
RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1")) if os.environ.get("WORLD_SIZE", "").isdigit() else 1


def write(obj):
    with open(os.path.join(OUT, f"result.rank{RANK}.json"), "w") as f:
        json.dump(obj, f)


def train(engine, steps, dtype=torch.float32, before_step=None):
    for step in range(steps):
        if before_step:
            before_step(step)
        x, y = cases.rank_batch("mlp", step, RANK, WORLD)
        loss = cases.loss_fn("mlp", engine(x.to(dtype)), y)
        engine.backward(loss)
        engine.step()


def main(zero):
    cfg = cases.config(2, "fp32", WORLD)
    model = cases.build("mlp")
    if CASE == "params-differ":
        if RANK == 1:
            torch.manual_seed(cases.MODEL_SEED)
            model = torch.nn.Sequential(torch.nn.Linear(16, 65), torch.nn.GELU(), torch.nn.LayerNorm(65),
                                        torch.nn.Linear(65, 5))
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        train(engine, 2)
    elif CASE == "param-replaced":
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        train(engine, 1)
        model[0].weight = torch.nn.Parameter(model[0].weight.detach().clone())
        train(engine, 2)
    elif CASE == "loss-without-graph":
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        engine.backward(torch.tensor(1.0))
        engine.step()
    elif CASE == "auto-in-config":
        cfg["optimizer"]["params"]["lr"] = "auto"
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        train(engine, 1)
    elif CASE == "rank-exits":
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)

        def exit_rank1(step):
            if RANK == 1 and step == 2:
                write({"outcome": "exited", "time": time.time()})
                os._exit(3)

        train(engine, 6, before_step=exit_rank1)
    elif CASE == "config-missing":
        path = os.path.join(OUT, "no-such-dir", "ds_config.json")
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=path)
        train(engine, 1)
    elif CASE == "no-parameters":
        model = torch.nn.Sequential(torch.nn.GELU())
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    elif CASE == "int64-parameter":
        model.register_parameter("count", torch.nn.Parameter(torch.zeros(3, dtype=torch.int64),
                                                             requires_grad=False))
        cfg = cases.config(2, "bf16", WORLD)
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        train(engine, 1, torch.bfloat16)
    elif CASE == "half-launcher-env":  # the test sets RANK and leaves WORLD_SIZE unset
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        train(engine, 1)
    else:
        raise SystemExit(f"unknown case {CASE}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    import zero  # outside the try: an import failure is not the error a case is after

    try:
        main(zero)
    except Exception as e:  # noqa: BLE001 - the outcome under test
        write({"outcome": "error", "type": type(e).__name__, "is_zero_error": isinstance(e, zero.ZeroError),
               "message": str(e), "time": time.time(), "traceback": traceback.format_exc()})
        traceback.print_exc()
        sys.exit(1)
    write({"outcome": "finished", "time": time.time()})
