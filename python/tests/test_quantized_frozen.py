"""zero_quantized_nontrainable_weights through zero.initialize at stage 3 (the LoRA case): a
frozen base layer's weight is kept as int8 blocks and computes dequantized (within half a
quantization step of its value, and not equal to it), the adapters train alongside as they do with
the weight kept whole, and the engine's parameter memory shrinks. One rank, in this process."""
from statistics import mean

import torch

import zero

D, RANK, BATCH, STEPS = 64, 4, 32, 60


class Lora(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.base = torch.nn.Linear(D, D)
        self.base.requires_grad_(False)
        self.a = torch.nn.Linear(D, RANK, bias=False)
        self.b = torch.nn.Linear(RANK, D, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


def train(quantized):
    model = Lora()
    original = model.base.weight.detach().clone()
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "zero_quantized_nontrainable_weights": quantized}}
    engine, *_ = zero.initialize(model=model, config=config,
                                 model_parameters=[p for p in model.parameters() if p.requires_grad])
    # The target is the base layer plus a rank-RANK change: what the adapters can learn.
    g = torch.Generator().manual_seed(1)
    delta = torch.randn(D, RANK, generator=g) @ torch.randn(RANK, D, generator=g) * 0.1
    bias = Lora().base.bias.detach()
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, D, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x), x @ (original.t() + delta) + bias)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    with zero.GatheredParameters([model.base.weight]):
        seen = model.base.weight.detach().clone()
    memory = engine.memory()
    engine.close()
    return original, seen, losses, memory


def low_precision_bytes(memory):
    return sum(kind["tags"].get("low_precision_params", {}).get("bytes", 0)
               for kind in memory["kinds"].values())


def test_frozen_weight_is_int8_dequantized_and_the_adapters_train():
    original, whole_seen, whole_losses, whole_memory = train(False)
    _, seen, losses, memory = train(True)
    assert torch.equal(whole_seen, original)  # kept whole: exact
    assert not torch.equal(seen, original)  # quantized: the values changed...
    # ...by at most half a step of their 256-element block (scale = max |w| / 127).
    blocks = original.reshape(-1, 256)
    half_step = blocks.abs().amax(dim=1, keepdim=True) / 127 / 2
    assert ((seen.reshape(-1, 256) - blocks).abs() <= half_step * 1.0001).all()
    first, last, whole_last = mean(losses[:5]), mean(losses[-5:]), mean(whole_losses[-5:])
    assert last < 0.6 * first, losses  # the adapters learned
    assert abs(last - whole_last) <= 0.05 * whole_last, (losses, whole_losses)
    saved = low_precision_bytes(whole_memory) - low_precision_bytes(memory)
    assert saved >= D * D * 4 - D * D - 64, (whole_memory, memory)
