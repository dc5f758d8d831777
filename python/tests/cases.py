"""The models, data and configs the tests train, shared by the pytest side and the workers.

Every run of a model sees the same global batch at each step whatever the world size: the
global batch is GLOBAL_BATCH samples, rank r of n takes rows [r*m, (r+1)*m) with m = GLOBAL_BATCH/n.
So the per-rank mean losses averaged over ranks equal the global-batch mean loss, and every
world size is compared with one torch.optim.AdamW run in one process on the global batch.
"""
import math

import torch
import torch.nn.functional as F

GLOBAL_BATCH = 12  # divisible by every world size the tests use (1, 2, 3)
STEPS = 20
LR = 2e-3
BETAS = (0.9, 0.999)
# Adam moves a weight by lr·g/(|g| + eps): where g is nearly all rounding noise (a nearly dead
# unit, an embedding row little used), a gradient error e moves the weight by up to lr·e/eps.
# The ranks' sum differs from one process's global batch in its last bits, so eps = 1e-8 puts the
# transformer's fp32 weights 10x outside the 1e-5 tolerance; 1e-5 keeps them 8x inside it (3 ranks).
EPS = 1e-5
WEIGHT_DECAY = 0.01
# Written in every config (absent, zero and DeepSpeed < 0.19.3 do not clip; DeepSpeed >= 0.19.3 clips at 1.0)
# and applied to the reference: both models' gradient norms exceed it in the first steps.
GRADIENT_CLIPPING = 1.0
MODEL_SEED = 5

STAGES = (0, 1, 2, 3)
DTYPES = ("fp32", "bf16", "fp16")


# --- models -----------------------------------------------------------------------------------

def mlp():
    """The MLP of shared/acceptance/torch/mlp_train.py."""
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                               torch.nn.Linear(64, 5))


VOCAB, SEQ, D_MODEL, HEADS, LAYERS = 128, 16, 96, 4, 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(D_MODEL)
        # No bias: a key bias gets an exactly-zero gradient (softmax ignores a shift shared by all
        # keys), which leaves Adam amplifying rounding noise that differs with the reduction order.
        self.qkv = torch.nn.Linear(D_MODEL, 3 * D_MODEL, bias=False)
        self.proj = torch.nn.Linear(D_MODEL, D_MODEL)
        self.ln2 = torch.nn.LayerNorm(D_MODEL)
        self.fc = torch.nn.Linear(D_MODEL, 4 * D_MODEL)
        self.out = torch.nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // HEADS
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, HEADS, hd).transpose(1, 2) for z in (q, k, v))
        # Written out rather than scaled_dot_product_attention: the same kernels on every dtype.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(torch.nn.Module):
    """A causal transformer whose output projection is the token embedding (tied weights)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        torch.nn.init.normal_(self.embed.weight, std=0.02)  # tied: the logits start near zero
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(D_MODEL)
        self.lm_head = torch.nn.Linear(D_MODEL, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


MODELS = {"mlp": mlp, "transformer": TinyLM}


def build(model_name, seed=MODEL_SEED):
    torch.manual_seed(seed)
    return MODELS[model_name]()


# --- data -------------------------------------------------------------------------------------

def global_batch(model_name, step):
    g = torch.Generator().manual_seed(100 + step)
    if model_name == "mlp":
        return torch.randn(GLOBAL_BATCH, 16, generator=g), torch.randn(GLOBAL_BATCH, 5, generator=g)
    # Sequences that count up by a per-sequence stride: learnable, so the loss falls.
    start = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (GLOBAL_BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def rank_batch(model_name, step, rank, world):
    x, y = global_batch(model_name, step)
    m = GLOBAL_BATCH // world
    return x[rank * m:(rank + 1) * m], y[rank * m:(rank + 1) * m]


def loss_fn(model_name, out, y):
    out = out.float()
    if model_name == "mlp":
        return F.mse_loss(out, y)
    return F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))


def model_input(x, param_dtype):
    """Float inputs follow the parameters' dtype (bf16/fp16 training); token ids stay int64."""
    return x.to(param_dtype) if x.is_floating_point() else x


# --- configs ----------------------------------------------------------------------------------

def config(stage, dtype, world, fp16_scale=None):
    """A DeepSpeed config: AdamW, gradient clipping, no scheduler, global batch GLOBAL_BATCH,
    accumulation 1.

    fp16_scale: a fixed loss scale, or None for a dynamic one (starting at 2^8).
    """
    cfg = {
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": GRADIENT_CLIPPING,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                  "weight_decay": WEIGHT_DECAY}},
        # Small buckets and persistence threshold: several buckets, and stage 3 partitions and
        # gathers most parameters, even on these small models.
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000, "allgather_bucket_size": 5000,
                              "stage3_param_persistence_threshold": 100,
                              "stage3_prefetch_bucket_size": 5000},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "fp16":
        cfg["fp16"] = ({"enabled": True, "loss_scale": fp16_scale} if fp16_scale
                       else {"enabled": True, "loss_scale": 0, "initial_scale_power": 8})
    return cfg


# fp16 loss scale per model: the MLP trains with a dynamic scale, the transformer with a fixed one.
FP16_SCALE = {"mlp": None, "transformer": 128.0}


# --- the reference ----------------------------------------------------------------------------

def replacement(model_name):
    """New values for every parameter of `model_name` (name -> fp32 tensor, exact in bf16), which
    the GatheredParameters tests write in mid-training."""
    g = torch.Generator().manual_seed(77)
    return {n: (0.05 * torch.randn(p.shape, generator=g)).bfloat16().float()
            for n, p in build(model_name).named_parameters()}


def reference(model_name, steps=STEPS, replace=None):
    """torch.optim.AdamW in this process on the global batch, the gradients clipped to a global
    L2 norm of GRADIENT_CLIPPING first: (fp32 state dict, losses).
    replace: (step, {name: values}): the parameters take those values before that step, and
    AdamW keeps its moments."""
    model = build(model_name)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(steps):
        if replace is not None and step == replace[0]:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(replace[1][n])
        x, y = global_batch(model_name, step)
        opt.zero_grad()
        loss = loss_fn(model_name, model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRADIENT_CLIPPING)
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


# --- gradient accumulation (issue 30) ---------------------------------------------------------

R_VOCAB, R_SEQ, R_EMBED, R_HIDDEN = 64, 10, 16, 24


class RecurrentLM(torch.nn.Module):
    """Embedding -> GRU -> LayerNorm -> Conv1d -> Linear, with the shapes a summation order
    shows in: `gate` is used twice in one forward (autograd sums its two gradients), and `aux`
    runs only when forward is told to (no gradient in the other micro-batches)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(R_VOCAB, R_EMBED)
        self.gru = torch.nn.GRU(R_EMBED, R_HIDDEN, batch_first=True)
        self.ln = torch.nn.LayerNorm(R_HIDDEN)
        self.conv = torch.nn.Conv1d(R_HIDDEN, R_HIDDEN, kernel_size=3, padding=1)
        self.gate = torch.nn.Parameter(torch.linspace(0.5, 1.5, R_HIDDEN))
        self.aux = torch.nn.Linear(R_HIDDEN, R_HIDDEN)
        self.head = torch.nn.Linear(R_HIDDEN, R_VOCAB)

    def forward(self, tokens, use_aux=True):
        h, _ = self.gru(self.embed(tokens))
        h = self.ln(h) * self.gate
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        h = torch.tanh(h * self.gate)
        if use_aux:
            h = h + self.aux(h)
        return self.head(h)


ACCUM_MICRO = 2  # rows per rank per micro-batch
ACCUM_STEPS = 4  # optimizer steps
ACCUM_SEED = 11


def accum_batch(step, micro, rank, world):
    """Rank `rank`'s rows of micro-batch `micro` of optimizer step `step`: (tokens, next tokens)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    seq = torch.randint(0, R_VOCAB, (ACCUM_MICRO * world, R_SEQ + 1), generator=g)
    rows = seq[rank * ACCUM_MICRO:(rank + 1) * ACCUM_MICRO]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def accum_config(stage, dtype, gas):
    """The configuration of issue 30's report: AdamW, WarmupLR, clipping 0.5, small buckets."""
    cfg = {
        "train_micro_batch_size_per_gpu": ACCUM_MICRO,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                     "warmup_num_steps": 2}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000,
                              "allgather_bucket_size": 3000,
                              "stage3_param_persistence_threshold": 100},
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg
