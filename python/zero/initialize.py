"""zero.initialize: deepspeed.initialize's signature and return values, on zero's engine."""

import torch

from ._lib import ZeroError
from .engine import ZeroEngine

# Client optimizers zero can run itself: their hyperparameters become the config's optimizer.
_CLIENT_OPTIMIZERS = {torch.optim.Adam: "Adam", torch.optim.AdamW: "AdamW"}


class ZeroOptimizer(torch.optim.Optimizer):
    """What initialize returns as the optimizer: the engine's param groups (their current lr is
    kept up to date after every step). The engine steps it: call engine.step(), not this. A torch
    Optimizer, so that torch's LR schedulers can be built on it: an lr a scheduler (or anyone)
    writes into param_groups[g]["lr"] is the lr of group g from the next optimizer step on,
    unless the config has a "scheduler" block."""

    def __init__(self, engine, groups):
        super().__init__(groups, {"lr": groups[0]["lr"] if groups else 0.0})
        self.engine = engine

    def zero_grad(self, set_to_none=True):
        self.engine.zero_grad()

    def step(self, closure=None):
        raise ZeroError("the optimizer is stepped by engine.step(); call that instead")

    def refresh(self, lrs=None):
        """After an optimizer step: the lr each group uses next (`lrs`, else asked for). Also
        tells torch's LR schedulers that this optimizer did step (the flag their step() checks
        before warning that they ran first: the engine steps, not optimizer.step())."""
        for g, lr in zip(self.param_groups, self.engine.get_lr() if lrs is None else lrs):
            g["lr"] = lr
        self._opt_called = True


class ZeroLRScheduler:
    """What initialize returns as the lr scheduler when the config has a "scheduler" block: the
    engine runs the schedule at every optimizer step; this reports it."""

    def __init__(self, engine):
        self.engine = engine

    def get_lr(self):
        return self.engine.get_lr()

    def get_last_lr(self):
        return self.engine.get_lr()

    def step(self, *args, **kwargs):
        """Nothing to do: engine.step() advances the schedule (as with DeepSpeed's config
        schedulers)."""


def _from_client_optimizer(optimizer, config):
    """(config with an optimizer block, per-group overrides) for a torch Adam/AdamW instance."""
    # deepspeed.ops.adam's DeepSpeedCPUAdam / FusedAdam name their kind.
    kind = getattr(optimizer, "zero_optimizer_type", None) or _CLIENT_OPTIMIZERS.get(
        type(optimizer))
    if kind is None:
        raise ZeroError(f"optimizer is a {type(optimizer).__name__}; zero runs its own optimizer "
                        "kernels: pass None and put an \"optimizer\" block in the config, or pass "
                        "a torch.optim.Adam / AdamW whose settings zero then uses")
    if "optimizer" in config:
        raise ZeroError("both the config's \"optimizer\" block and an optimizer object were "
                        "given; pass one of them")
    d = optimizer.defaults
    config = dict(config)
    config["optimizer"] = {"type": kind, "params": {"lr": d["lr"], "betas": list(d["betas"]),
                                                    "eps": d["eps"],
                                                    "weight_decay": d["weight_decay"]}}
    overrides = [(float(g["lr"]), float(g["weight_decay"])) for g in optimizer.param_groups]
    groups = [{"params": g["params"]} for g in optimizer.param_groups]
    return config, overrides, groups


def _client_scheduler(lr_scheduler, client_optimizer, zero_optimizer, engine):
    """The caller's LR scheduler, or None: an object with step() built on the client optimizer
    (whose param groups' lr the engine then follows), or a callable that builds one on the
    engine's optimizer, as deepspeed.initialize takes it. The engine steps it after each applied
    optimizer step, as DeepSpeed's engine does."""
    if lr_scheduler is None:
        return None
    if "scheduler" in engine.config:
        engine.close()
        raise ZeroError("initialize: both the config's \"scheduler\" block and an lr_scheduler "
                        "were given; pass one of them")
    if not hasattr(lr_scheduler, "step") and callable(lr_scheduler):
        lr_scheduler = lr_scheduler(zero_optimizer)
    built_on = getattr(lr_scheduler, "optimizer", None)
    if built_on is not client_optimizer and built_on is not zero_optimizer:
        engine.close()
        raise ZeroError("initialize: lr_scheduler is not built on the optimizer passed to "
                        "initialize: build it on that optimizer (or pass a callable that builds "
                        "it on the one initialize returns)")
    engine._client_scheduler = lr_scheduler
    return lr_scheduler


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
               config=None, config_params=None):
    """Returns (engine, optimizer, training_dataloader, lr_scheduler) as deepspeed.initialize."""
    if model is None:
        raise ZeroError("initialize: model is required")
    if config is None:
        config = config_params
    if config is None and args is not None:
        config = getattr(args, "deepspeed_config", None) or getattr(args, "zero_config", None)
    if config is None:
        raise ZeroError("initialize: no config: pass config= (a path to a ds_config.json or a "
                        "dict)")
    if mpu is not None:
        raise ZeroError("initialize: mpu (model parallelism) is not supported; zero is "
                        "data-parallel only")
    overrides = None
    if optimizer is not None:
        from ._config import load_config
        _, document = load_config(config)
        config, overrides, groups = _from_client_optimizer(optimizer, document)
        model_parameters = groups
    param_list = list(model_parameters) if model_parameters is not None else None
    engine = ZeroEngine(model, param_list, config, overrides)

    if param_list and isinstance(param_list[0], dict):
        groups = [dict(g, params=list(g["params"])) for g in param_list]
    else:
        params = param_list if param_list is not None else list(model.parameters())
        groups = [{"params": params}]
    for g, lr in zip(groups, engine.get_lr()):
        g["lr"] = lr
    zero_optimizer = ZeroOptimizer(engine, groups)
    engine.optimizer = zero_optimizer
    # Whose param groups' lr the engine follows: the optimizer initialize returns, and the
    # caller's own (DeepSpeed's optimizer shares the caller's param groups; schedulers are built
    # on either).
    engine._lr_sources = [zero_optimizer] + ([optimizer] if optimizer is not None else [])
    engine._sync_lr_sources()

    scheduler = _client_scheduler(lr_scheduler, optimizer, zero_optimizer, engine)
    if scheduler is None and "scheduler" in engine.config:
        scheduler = ZeroLRScheduler(engine)
    engine.lr_scheduler = scheduler

    dataloader = None
    if training_data is not None:
        sampler = torch.utils.data.distributed.DistributedSampler(
            training_data, num_replicas=engine.world_size, rank=engine.global_rank)
        dataloader = torch.utils.data.DataLoader(
            training_data, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler,
            collate_fn=collate_fn)
    return engine, zero_optimizer, dataloader, scheduler
