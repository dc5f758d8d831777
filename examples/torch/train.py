# A DeepSpeed-style training script on zero: only the import differs from DeepSpeed's.
#   python train.py                          one process
#   torchrun --nproc-per-node 2 train.py     two processes on this host (shared memory)
import os
import torch
import zero  # was: import deepspeed

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds_config.json")
engine, optimizer, _, scheduler = zero.initialize(  # was: deepspeed.initialize
    model=model, model_parameters=model.parameters(), config=config)

rank, world = engine.global_rank, engine.world_size
teacher = torch.nn.Linear(32, 10)  # the same on every rank (seeded above)
dtype = next(engine.module.parameters()).dtype
for step in range(50):
    g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own micro-batch
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), 32, generator=g)
    loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), teacher(x).detach())
    engine.backward(loss)
    engine.step()
    if rank == 0 and step % 10 == 9:
        print(f"step {step + 1}: loss {loss.item():.4f} lr {engine.get_lr()[0]:.2e}")
engine.save_checkpoint("checkpoints")  # zero_to_fp32 checkpoints out.safetensors reads it back
