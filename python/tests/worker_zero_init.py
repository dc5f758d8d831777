"""One rank of the zero.Init checks (plain python, or under torchrun).

  worker_zero_init.py OUT

Builds a small model (an embedding, a GRU, a LayerNorm and Linear layers, one tied weight) inside
zero.Init with a seed, and the same model outside it with the same seed, and writes
OUT/rank<R>.json:
  partitioned   every parameter left empty with ds_shape / ds_numel / a slice of
                ceil(numel / world) elements, as DeepSpeed partitions it
  gathered_eq   GatheredParameters shows the values the model built outside has
  apply_eq      Module.apply(fn) inside the context sees whole parameters and keeps rank 0's
  modifier      GatheredParameters(modifier_rank=R) keeps R's values; modifier_rank None drops
                changes
  trained_eq    per stage 1 and 3: the Init model trained through zero.initialize has bitwise
                the weights the outside model gets (gather_master after 3 steps)
  refused       the messages of bad usage
"""
import json
import os
import sys
from pathlib import Path

import torch

import zero

STAGES = (1, 3)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(24, 6)
        self.rnn = torch.nn.GRU(6, 6, batch_first=True)
        self.norm = torch.nn.LayerNorm(6)
        self.hidden = torch.nn.Linear(6, 10)
        self.out = torch.nn.Linear(10, 24)
        self.head = torch.nn.Linear(6, 24, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.05)

    def forward(self, ids):
        h, _ = self.rnn(self.embed(ids))
        h = self.norm(h)
        return self.out(torch.relu(self.hidden(h))) + self.head(h)


def config(stage, world):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
            "train_batch_size": 2 * world, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500,
                                  "stage3_param_persistence_threshold": 30}}


def train(model, stage, rank, world):
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(),
                                      config=config(stage, world))
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        ids = torch.randint(0, 24, (2 * world, 5), generator=g)[2 * rank:2 * rank + 2]
        logits = engine(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 24), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
    out = {n: engine.gather_master(n) for n, _ in model.named_parameters()}
    engine.close()
    return out


def main():
    out = Path(sys.argv[1])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    report = {}

    torch.manual_seed(3)
    reference = Net()
    expect = {n: p.detach().clone() for n, p in reference.named_parameters()}
    torch.manual_seed(3)
    with zero.Init():
        model = Net()
    params = dict(model.named_parameters())
    report["partitioned"] = all(
        p.numel() == 0 and tuple(p.ds_shape) == tuple(expect[n].shape)
        and p.ds_numel == expect[n].numel() and p.ds_tensor.numel() == -(-p.ds_numel // world)
        for n, p in params.items())
    report["tied_kept"] = model.head.weight is model.embed.weight
    with zero.GatheredParameters(list(params.values())):
        report["gathered_eq"] = all(torch.equal(p, expect[n]) for n, p in params.items())
    report["released"] = all(p.numel() == 0 for p in params.values())

    # Module.apply inside the context: fn sees whole parameters, rank 0's result is kept.
    with zero.Init():
        torch.manual_seed(100 + rank)  # ranks differ: rank 0's values must win
        model.apply(lambda m: torch.nn.init.uniform_(m.weight)
                    if isinstance(m, torch.nn.Linear) else None)
    torch.manual_seed(100)
    for m in reference.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.uniform_(m.weight)
    with zero.GatheredParameters(list(params.values())):
        report["apply_eq"] = all(torch.equal(p, reference.get_parameter(n))
                                 for n, p in params.items())

    # modifier_rank: the last rank's changes are kept, None drops them.
    last = world - 1
    with zero.GatheredParameters([model.out.bias], modifier_rank=last):
        with torch.no_grad():
            model.out.bias.fill_(float(rank + 1))
    with zero.GatheredParameters([model.out.bias]):
        kept = bool((model.out.bias == float(last + 1)).all())
        with torch.no_grad():
            model.out.bias.fill_(-7.0)
    with zero.GatheredParameters([model.out.bias]):
        dropped = bool((model.out.bias == float(last + 1)).all())
    report["modifier"] = [kept, dropped]
    with torch.no_grad():
        reference.out.bias.fill_(float(last + 1))

    refused = []
    for bad in (lambda: zero.Init(mpu=object()),
                lambda: zero.GatheredParameters([model.out.bias], modifier_rank=world).__enter__()):
        try:
            bad()
            refused.append(None)
        except zero.ZeroError as e:
            refused.append(str(e))
    report["refused"] = refused

    # Training: the Init model through the engine, against the reference built outside.
    state = {n: p.detach().clone() for n, p in reference.named_parameters()}
    report["trained_eq"] = {}
    for stage in STAGES:
        torch.manual_seed(3)
        with zero.Init():
            built = Net()
        with zero.GatheredParameters(list(built.parameters()), modifier_rank=0):
            with torch.no_grad():
                for n, p in built.named_parameters():
                    p.copy_(state[n])
        outside = Net()
        with torch.no_grad():
            for n, p in outside.named_parameters():
                p.copy_(state[n])
        a, b = train(built, stage, rank, world), train(outside, stage, rank, world)
        report["trained_eq"][stage] = all(torch.equal(a[n], b[n]) for n in a) and any(
            not torch.equal(a[n], state[n]) for n in a)
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
