"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam as names a script builds and hands to
deepspeed.initialize (Accelerate swaps a torch AdamW for DeepSpeedCPUAdam when the config
offloads the optimizer). zero runs its own Adam kernels on its own master weights, on the CPU or
the GPU as the config says: these objects only carry the hyperparameters and param groups, which
initialize turns into the config's optimizer. Calling their step() is an error."""
import torch

from ..._lib import ZeroError


class _AdamSettings(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, adamw_mode=True, **_deepspeed_only):
        if amsgrad:
            raise ZeroError(f"{type(self).__name__}(amsgrad=True): zero's Adam has no AMSGrad")
        if not bias_correction:
            raise ZeroError(f"{type(self).__name__}(bias_correction=False): zero's Adam always "
                            "corrects bias")
        super().__init__(model_params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                        "weight_decay": weight_decay})
        self.adamw_mode = bool(adamw_mode)

    # What zero.initialize reads: the config optimizer's "type".
    @property
    def zero_optimizer_type(self):
        return "AdamW" if self.adamw_mode else "Adam"

    def step(self, closure=None):
        raise ZeroError(f"{type(self).__name__} only carries settings for zero.initialize; zero's "
                        "engine runs the optimizer (engine.step())")


class DeepSpeedCPUAdam(_AdamSettings):
    """deepspeed.ops.adam.DeepSpeedCPUAdam's signature; adamw_mode=True (the default) is AdamW."""


class FusedAdam(_AdamSettings):
    """deepspeed.ops.adam.FusedAdam's signature; adamw_mode=True (the default) is AdamW."""


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
