"""One process loading a checkpoint DeepSpeed made: worker_ds_import.py FIXTURE_DIR STAGE OUT

The model of tests/data/deepspeed_checkpoints (scripts/make_ds_checkpoints.py) under
zero.initialize at ZeRO stage STAGE, load_checkpoint(FIXTURE_DIR), save_checkpoint(OUT, "loaded")
of what was loaded, two training steps, and OUT/result.json: {"global_steps_loaded",
"global_steps", "losses"}.
"""
import json
import os
import sys

import torch

import zero

FIXTURE, STAGE, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(13, 40), torch.nn.ReLU(), torch.nn.LayerNorm(40),
                            torch.nn.Linear(40, 24), torch.nn.ReLU(), torch.nn.Linear(24, 5))
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-6,
                                                     "weight_decay": 0.01}},
          "zero_optimization": {"stage": STAGE, "stage3_param_persistence_threshold": 0}}
engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=config)
path, client_state = engine.load_checkpoint(FIXTURE)
loaded_steps = engine.global_steps
engine.save_checkpoint(OUT, tag="loaded")
g = torch.Generator().manual_seed(1)
losses = []
for _ in range(2):
    x, y = torch.randn(4, 13, generator=g), torch.randn(4, 5, generator=g)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
with open(os.path.join(OUT, "result.json"), "w") as f:
    json.dump({"global_steps_loaded": loaded_steps, "global_steps": engine.global_steps,
               "losses": losses, "path": path}, f)
