"""A DeepSpeed-style script for test_as_deepspeed.py, run under `python -m zero.as_deepspeed`
(one process or torchrun): it imports deepspeed as accelerate and transformers do, checks the
module-level names they use, trains a small MLP through deepspeed.initialize for 3 steps and
writes what it saw to OUT/rank<R>.json.

  worker_as_deepspeed.py OUT [EXTRA ARGS...]
"""
import importlib.metadata
import importlib.util
import json
import os
import sys

import torch

import deepspeed
from deepspeed.accelerator import get_accelerator
from deepspeed.checkpoint.utils import clone_tensors_for_torch_save
from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME
from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES
from deepspeed.utils import logger

out = sys.argv[1]
seen = {"argv": sys.argv[1:], "name": __name__,
        "module": deepspeed.__name__, "version": deepspeed.__version__,
        "find_spec": importlib.util.find_spec("deepspeed") is not None,
        "metadata_name": importlib.metadata.metadata("deepspeed")["Name"],
        "metadata_version": importlib.metadata.version("deepspeed"),
        "schedules": VALID_LR_SCHEDULES, "env_file": DEEPSPEED_ENVIRONMENT_NAME,
        "device": get_accelerator().current_device_name(),
        "engine_class": deepspeed.DeepSpeedEngine.__name__}
logger.info("worker_as_deepspeed: deepspeed %s", deepspeed.__version__)

deepspeed.comm.init_distributed(dist_backend="gloo")
seen["dist"] = [torch.distributed.is_initialized(), torch.distributed.get_backend(),
                deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()]
t = torch.arange(4.0)
copy = clone_tensors_for_torch_save({"a": [t[:2]], "b": (t,)})
seen["clone"] = [copy["a"][0].untyped_storage().nbytes(), copy["b"][0].tolist()]

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
before = [p.detach().clone() for p in model.parameters()]
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
          "zero_optimization": {"stage": 2}}
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config_params=config)
seen["is_engine"] = isinstance(engine, deepspeed.DeepSpeedEngine)
for step in range(3):
    g = torch.Generator().manual_seed(step * 10 + deepspeed.comm.get_rank())
    x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
seen["steps"] = engine.global_steps
seen["moved"] = max((p.detach() - b).abs().max().item()
                    for p, b in zip(engine.module.parameters(), before))
with open(os.path.join(out, f"rank{deepspeed.comm.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
