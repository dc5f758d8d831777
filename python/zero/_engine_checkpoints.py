"""ZeroEngine's checkpoint methods (DeepSpeed's names and arguments): save_checkpoint,
load_checkpoint, and the whole 16-bit model on rank 0 for savers of stage-3 models. A mixin of
ZeroEngine (engine.py), whose engine handle, stage-3 fetcher and LR bookkeeping they use."""
import ctypes
import json
import os
import warnings

import torch

from ._lib import ZeroError, call, take_string

# The key under which a checkpoint's client state carries the client LR scheduler's state_dict.
SCHEDULER_STATE_KEY = "zero:lr_scheduler"


class CheckpointMethods:
    # --- checkpoints ---
    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True,
                        exclude_frozen_parameters=False):
        """Writes save_dir/tag (default global_step<N>) and save_dir/latest; collective.
        client_state must be JSON (numbers, strings, lists, dicts). A client LR scheduler's
        state_dict goes in too (load_checkpoint restores it). Frozen parameters are always
        written: exclude_frozen_parameters is accepted and changes nothing (they are small next
        to the optimizer states zero writes anyway)."""
        self._check_alive()
        state = dict(client_state) if client_state is not None else {}
        what = "client_state"
        if self._client_scheduler is not None and hasattr(self._client_scheduler, "state_dict"):
            state[SCHEDULER_STATE_KEY] = self._client_scheduler.state_dict()
            what = "client_state or the lr scheduler's state_dict"
        try:
            state = json.dumps(state)
        except (TypeError, ValueError) as e:
            raise ZeroError(f"save_checkpoint: {what} cannot be stored as JSON ({e}); keep "
                            "tensors and functions out of it") from None
        if self._fetcher is not None:
            self._fetcher.release_all()
        # The lr a client scheduler has set for the next step is what the checkpoint keeps.
        self._follow_lr()
        call("zero_engine_save_checkpoint", self._handle, os.fspath(save_dir).encode(),
             None if tag is None else str(tag).encode(), state.encode())
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, custom_load_fn=None):
        """Loads load_dir/tag (tag None: what load_dir/latest, or latest_universal, names), a zero
        or DeepSpeed checkpoint of any kind (ZeRO 0-3, BF16_Optimizer, universal), whatever world
        size and stage it was saved at: weights, optimizer states, counters and the lr schedule,
        and the client LR scheduler's state when load_lr_scheduler_states. Returns (path,
        client_state); (None, None) when tag is None and there is no `latest` file, as DeepSpeed
        does. load_module_strict is accepted (zero checks names and shapes always); loading
        weights without the optimizer states (load_optimizer_states=False, load_module_only) and
        custom_load_fn are not supported and raise ZeroError."""
        self._check_alive()
        if not load_optimizer_states or load_module_only or custom_load_fn is not None:
            raise ZeroError("load_checkpoint: zero loads weights and optimizer states together "
                            "(load_optimizer_states=False, load_module_only=True and "
                            "custom_load_fn are not supported); for the weights alone use "
                            "zero.utils.get_fp32_state_dict_from_zero_checkpoint")
        load_dir = os.fspath(load_dir)
        # DeepSpeed's universal checkpoints name their tag in latest_universal.
        if tag is None and not any(os.path.isfile(os.path.join(load_dir, f))
                                   for f in ("latest", "latest_universal")):
            warnings.warn(f"zero: no 'latest' file in {load_dir}; nothing loaded")
            return None, None
        if self._fetcher is not None:
            self._fetcher.release_all()
        state, path = ctypes.c_void_p(), ctypes.c_void_p()
        call("zero_engine_load_checkpoint", self._handle, load_dir.encode(),
             None if tag is None else str(tag).encode(), ctypes.byref(state), ctypes.byref(path))
        client_state = json.loads(take_string(state))
        scheduler_state = client_state.pop(SCHEDULER_STATE_KEY, None)
        if (load_lr_scheduler_states and scheduler_state is not None
                and self._client_scheduler is not None):
            self._client_scheduler.load_state_dict(scheduler_state)
        steps = ctypes.c_int64()
        call("zero_engine_global_steps", self._handle, ctypes.byref(steps))
        self.global_steps = steps.value
        self.micro_steps = steps.value * self.gradient_accumulation_steps()
        # The lr the checkpoint restored is every optimizer's, so that the engine does not take
        # a freshly built scheduler's first lr for a change (DeepSpeed restores param groups).
        self._sync_lr_sources()
        return take_string(path), client_state

    # --- the whole model on rank 0 ---
    def zero_gather_16bit_weights_on_model_save(self):
        """The config's zero_optimization.stage3_gather_16bit_weights_on_model_save (or its old
        name, ..._fp16_...): whether savers may gather the whole model at stage 3."""
        z = self.config.get("zero_optimization") or {}
        return bool(z.get("stage3_gather_16bit_weights_on_model_save",
                          z.get("stage3_gather_fp16_weights_on_model_save", False)))

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """The module's state_dict with every parameter whole, in the training dtype, on rank 0
        (an empty dict elsewhere); collective, one unit at a time. Tied names share a tensor."""
        from .gathered import GatheredParameters
        self._check_alive()
        rank0 = self.global_rank == 0
        values = {}  # id(param) -> whole value (rank 0)
        for p in dict.fromkeys(self.module.parameters()):
            if exclude_frozen_parameters and not p.requires_grad:
                continue
            with GatheredParameters([p]):
                if rank0:
                    values[id(p)] = p.detach().clone().cpu()
        if not rank0:
            return {}
        out = {}
        for key, t in self.module.state_dict(keep_vars=True).items():
            if isinstance(t, torch.nn.Parameter):
                if id(t) in values:
                    out[key] = values[id(t)]
            else:
                out[key] = t.detach().clone().cpu()
        return out

    _consolidated_16bit_state_dict = _zero3_consolidated_16bit_state_dict
