"""A plain Accelerate training loop with a DeepSpeed plugin, as the Accelerate guides write it:
prepare, accumulate, backward, clip_grad_norm_, a torch LR scheduler, save_state / load_state and
get_state_dict. Runs on real DeepSpeed (`python worker_accelerate.py ...`) and on zero
(`python -m zero.as_deepspeed worker_accelerate.py ...`), in one process or under torchrun.

    worker_accelerate.py OUT --stage S [--resume]

Without --resume: 6 optimizer steps (12 micro-batches, accumulation 2), the state saved after
step 3 in OUT/state; with --resume: load OUT/state and run steps 4-6 again. Rank 0 writes
OUT/final[-resumed].safetensors (get_state_dict) and OUT/result[-resumed].json (losses, norms,
lrs)."""
import argparse
import json
import os
from pathlib import Path

import safetensors.torch
import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, set_seed

VOCAB, SEQ, MICRO, ACCUM, STEPS, SAVE_AT = 48, 8, 2, 2, 6, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.hidden = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.out = torch.nn.Linear(32, VOCAB)

    def forward(self, ids):
        return self.out(self.norm(torch.nn.functional.gelu(self.hidden(self.embed(ids)))))


def batches(world):
    g = torch.Generator().manual_seed(7)
    n = MICRO * ACCUM * STEPS * world
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    return torch.utils.data.TensorDataset((start + torch.arange(SEQ + 1) * 3) % VOCAB)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--stage", type=int, required=True)
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": ACCUM,
              "gradient_clipping": 1.0,
              "zero_optimization": {"stage": a.stage, "reduce_bucket_size": 2048,
                                    "allgather_bucket_size": 2048,
                                    "stage3_param_persistence_threshold": 32,
                                    "stage3_gather_16bit_weights_on_model_save": True}}
    plugin = DeepSpeedPlugin(hf_ds_config=config, gradient_accumulation_steps=ACCUM)
    accelerator = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=ACCUM,
                              cpu=not torch.cuda.is_available())
    set_seed(11)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    loader = torch.utils.data.DataLoader(batches(accelerator.num_processes), batch_size=MICRO,
                                         shuffle=False)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    skip = 0
    if a.resume:
        accelerator.load_state(str(out / "state"))
        skip = SAVE_AT * ACCUM
    losses, norms, lrs = [], [], []
    step = SAVE_AT if a.resume else 0
    for i, (seq,) in enumerate(loader):
        if i < skip:
            continue
        with accelerator.accumulate(model):
            logits = model(seq[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     seq[:, 1:].reshape(-1))
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
                norms.append(None if norm is None else float(norm))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
        if accelerator.sync_gradients:
            step += 1
            lrs.append(scheduler.get_last_lr()[0])
            if step == SAVE_AT and not a.resume:
                accelerator.save_state(str(out / "state"))

    state = accelerator.get_state_dict(model)
    suffix = "-resumed" if a.resume else ""
    if accelerator.is_main_process:
        safetensors.torch.save_file({k: v.detach().float().contiguous() for k, v in state.items()},
                                    str(out / f"final{suffix}.safetensors"))
        import deepspeed
        (out / f"result{suffix}.json").write_text(json.dumps(
            {"losses": losses, "norms": norms, "lrs": lrs, "steps": step,
             "deepspeed": deepspeed.__version__, "world": accelerator.num_processes}))
    accelerator.end_training()


if __name__ == "__main__":
    main()
