"""ZeroEngine: the object zero.initialize returns, with DeepSpeed's engine methods.

The model's parameters live in the engine: at stages 0-2 each parameter's .data is a view of the
engine's model copy (refreshed in place by every optimizer step); at stage 3 they are
placeholders filled per module (see _stage3). Gradients go to the engine as autograd produces
them (a post-accumulate-grad hook per parameter), so the engine reduces buckets while backward
goes on.

A model on a GPU gets an engine on that GPU: the model copy, gathered units, gradient slots,
master weights and optimizer states are device memory (or where the config offloads them), and
the parameters are views of it. One C call copies a gradient into its slot on torch's current
stream and marks it ready: the engine's kernels (on the legacy default stream) wait for that copy
without the host waiting. On the CPU, one C call hands a gradient in and marks it ready: the
engine reduces it where autograd wrote it when its unit is that one parameter (every parameter of
_model.OWN_UNIT_MIN_NUMEL elements or more is; the tensor is kept until step() returns), and copies
it into its slot otherwise."""
import contextlib
import ctypes
import json
import os
import time
import warnings
import weakref

import torch

from . import _lib
from ._lib import ZeroError, call, take_string
from ._comm import Comm
from ._config import ZeroConfigWarning, load_config
from ._engine_checkpoints import CheckpointMethods
from ._memory import current_stream_getter, tensor_at
from ._model import (TORCH_DTYPES, ModuleTree, check_unchanged, model_device,
                     register, snapshot, training_dtype)
from ._stage3 import UnitFetcher
from .partitioned_init import gather, is_partitioned_param, release

# The Python side's share of engine.timings() (under "python"): seconds and counts.
PY_TIMINGS = {"grad_hook_s": 0.0,  # in the per-parameter gradient hooks (copy and C calls)
              "grad_hooks": 0,
              "grads_lent": 0,  # of them, gradients the engine reduced where autograd wrote them
              "check_unchanged_s": 0.0,  # checking that the module's parameters are the engine's
              "check_unchanged_calls": 0}


class ZeroEngine(CheckpointMethods, torch.nn.Module):
    def __init__(self, model, model_parameters, config, overrides_from_optimizer=None):
        super().__init__()
        if not isinstance(model, torch.nn.Module):
            raise ZeroError(f"model is a {type(model).__name__}; expected a torch.nn.Module")
        text, document = load_config(config)
        self.config = document  # the ds_config as a dict
        self._dtype = training_dtype(document)
        self._torch_dtype = TORCH_DTYPES[self._dtype]
        self.device = model_device(model)
        self.module = model
        registered, overrides, units = register(model, model_parameters, self._dtype)
        if overrides_from_optimizer is not None:
            overrides = overrides_from_optimizer
        if self._dtype != _lib.F32:
            model.to(self._torch_dtype)  # as DeepSpeed: the model trains in the 16-bit dtype
        self._registered = registered
        self._comm = Comm()
        self._handle = None
        self._create(text, registered, overrides)

        info = _lib.EngineInfo()
        call("zero_engine_info_get", self._handle, ctypes.byref(info))
        self._info = info
        self._warn_config()
        self._take_partitioned(registered)
        self.global_steps = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._last_result = None
        self._lr_sources = []  # optimizers whose param_groups' lr the engine follows (initialize)
        self._synced_lrs = []  # the lrs _sync_lr_sources() last wrote into them
        self._client_scheduler = None  # a caller's LR scheduler the engine steps
        self._boundary = None  # set_gradient_accumulation_boundary(); None: the count decides
        self._backward_open = False  # a backward ran since the last step()
        # forward() checked the module's parameters in this micro-step: step() need not again (a
        # change after it is found at the next forward, before anything reads the parameters).
        self._checked = False
        self._snapshot = snapshot(model)
        self._tree = ModuleTree(model)
        self._py_timings = dict(PY_TIMINGS)
        self._views = {}
        # Gradients the engine reduces where autograd wrote them (zero_engine_grad_lend): kept
        # alive until step() returns. ZERO_GRAD_IN_PLACE=0 copies every gradient instead.
        self._lent = []
        self._lend_grads = os.environ.get("ZERO_GRAD_IN_PLACE", "1") != "0"
        self._grad_hooks = []
        self._fetcher = None
        if info.stage == 3:
            self._fetcher = UnitFetcher(self._handle, registered, self._torch_dtype, self.device)
            self._fetcher.install(model, {id(r.param): r.unit for r in registered})
        else:
            self._alias_model_copy()
        owner = weakref.ref(self)
        for r in registered:
            r.param._zero_owner, r.param._zero_index = owner, r.index
        for r in registered:
            if r.trainable:
                self._grad_hooks.append(r.param.register_post_accumulate_grad_hook(
                    self._grad_hook(r)))

    # --- construction ---
    def _create(self, text, registered, overrides):
        keep = []  # ctypes objects the specs point into, alive until create returns
        specs = (_lib.ParamSpec * len(registered))()
        for i, r in enumerate(registered):
            shape = (ctypes.c_int64 * max(len(r.shape), 1))(*r.shape)
            tied = (ctypes.c_char_p * max(len(r.tied_names), 1))(
                *[n.encode() for n in r.tied_names])
            keep += [shape, tied]
            specs[i] = _lib.ParamSpec(r.name.encode(), shape, len(r.shape), self._dtype, r.group,
                                      r.unit, int(r.trainable), tied, len(r.tied_names))
        groups = (_lib.GroupOptions * max(len(overrides), 1))(
            *[_lib.GroupOptions(lr, wd) for lr, wd in overrides])
        # As many kernel threads as torch computes with: torchrun and mpirun set OMP_NUM_THREADS
        # (1 per process by default), so ranks sharing a host do not oversubscribe its cores.
        device = self.device.type if self.device.index is None else str(self.device)
        options = _lib.EngineOptions(groups, len(overrides), max(torch.get_num_threads(), 1), None,
                                     device.encode())

        errors = []

        def init(_user, index, out, numel):
            try:
                if is_partitioned_param(registered[index].param):
                    ctypes.memset(out, 0, numel * 4)  # set after create, gathered (see __init__)
                    return 0
                values = registered[index].param.detach().reshape(-1).float().cpu()
                ctypes.memmove(out, values.data_ptr(), numel * 4)
                return 0
            except Exception as e:  # reported through the status, never across the C boundary
                errors.append(e)
                return 1

        init_fn = _lib.INIT_FN(init)
        h = ctypes.c_void_p()
        try:
            call("zero_engine_create", text.encode(), self._comm.handle, specs, len(registered),
                 ctypes.byref(options), init_fn, None, ctypes.byref(h))
        except ZeroError as e:
            self._comm.close()
            if errors:
                raise ZeroError(f"reading the initial parameter values failed: {errors[0]}")
            if '"auto"' in str(e):
                raise ZeroError(f"{e}\nzero.initialize, like deepspeed.initialize, needs concrete "
                                "values where the config says \"auto\" (Hugging Face's Trainer "
                                "and Accelerate fill them in before calling DeepSpeed): replace "
                                "each one named above", e.status) from None
            raise
        self._handle = h

    _warned = set()  # config warnings already shown in this process

    def _warn_config(self):
        """The config's warnings (unknown keys with their did-you-mean, ...) reach the user as
        Python warnings, from rank 0, each once per process."""
        p = ctypes.c_void_p()
        call("zero_engine_config_warnings_json", self._handle, ctypes.byref(p))
        found = json.loads(take_string(p))
        if self.global_rank != 0:
            return
        for f in found:
            text = f"zero: ds_config {f['path']}: {f['message']}" if f["path"] else \
                f"zero: ds_config: {f['message']}"
            if text not in ZeroEngine._warned:
                ZeroEngine._warned.add(text)
                warnings.warn(text, ZeroConfigWarning, stacklevel=4)

    def _take_partitioned(self, registered):
        """Parameters built under zero.Init: each is gathered whole (over torch's default group,
        one at a time) and becomes the engine's; their zero.Init slices are dropped."""
        for r in registered:
            if is_partitioned_param(r.param):
                gather(r.param)
                self._set_param(r.index, r.param.data, 0)
                r.param.data = torch.empty(0, dtype=r.param.dtype, device=r.param.device)
                release(r.param)

    def _alias_model_copy(self):
        """Stages 0-2: every parameter's .data becomes the engine's model copy (no copy)."""
        for r in self._registered:
            ptr, nbytes = ctypes.c_void_p(), ctypes.c_size_t()
            call("zero_engine_param", self._handle, r.index, ctypes.byref(ptr),
                 ctypes.byref(nbytes))
            r.param.data = tensor_at(ptr.value, nbytes.value, self._torch_dtype, r.shape,
                                     self.device)
            self._views[r.index] = r.param.data_ptr() if nbytes.value else None

    def _check_unchanged(self):
        t0 = time.perf_counter()
        check_unchanged(self.module, self._snapshot, self._registered, self._views, self._tree)
        spent = self._py_timings
        spent["check_unchanged_s"] += time.perf_counter() - t0
        spent["check_unchanged_calls"] += 1

    def _grad_hook(self, r):
        """The post-accumulate-grad hook of r's parameter: the gradient goes into the engine, the
        parameter's .grad is dropped (stage 3: its unit is told), and the time is counted."""
        write = self._grad_writer(r)

        def hook(param):
            grad = param.grad
            if grad is None:
                return
            t0 = time.perf_counter()
            write(grad)
            param.grad = None
            if self._fetcher is not None:
                self._fetcher.grad_done(r)
            spent = self._py_timings
            spent["grad_hook_s"] += time.perf_counter() - t0
            spent["grad_hooks"] += 1
        return hook

    def _grad_writer(self, r):
        """One C call hands the gradient in and marks it ready. On a GPU
        zero_engine_grad_copy_on_stream copies it on torch's current stream (the engine's kernels
        ordered after the copy, the host not waiting). On the CPU zero_engine_grad_lend lets the
        engine reduce it where it is when it can (the tensor is then kept until step() returns),
        else copies it. No tensor is made over the slot."""
        handle, index = self._handle, r.index
        dtype, nbytes = self._torch_dtype, r.numel * self._torch_dtype.itemsize
        if self.device.type == "cuda":
            copy_on, current_stream = (_lib.bind("zero_engine_grad_copy_on_stream"),
                                       current_stream_getter(self.device))

            def hand_in(grad):
                copy_on(handle, index, grad.data_ptr(), nbytes, current_stream())
        else:
            copy_now, lend = _lib.bind("zero_engine_grad_copy"), _lib.bind("zero_engine_grad_lend")
            lent = ctypes.c_int()
            lent_ref, kept = ctypes.byref(lent), self._lent

            def hand_in(grad):
                if not self._lend_grads:
                    copy_now(handle, index, grad.data_ptr(), nbytes)
                    return
                lend(handle, index, grad.data_ptr(), nbytes, lent_ref)
                if lent.value:
                    kept.append(grad)
                    self._py_timings["grads_lent"] += 1

        def write(grad):
            if grad.dtype != dtype or not grad.is_contiguous():
                grad = grad.to(dtype).contiguous()
            hand_in(grad)
        return write

    # --- training ---
    def forward(self, *args, **kwargs):
        self._check_alive()
        self._check_unchanged()
        self._checked = True
        if self._fetcher is None:
            return self.module(*args, **kwargs)
        with self._fetcher.saved_tensors_hooks():
            return self.module(*args, **kwargs)

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """loss.backward() with the loss scaled as the engine needs (fp16 loss scale, and 1/GAS
        unless scale_wrt_gas is False); gradients reach the engine as autograd produces them.

        Hugging Face Accelerate calls step() only at the accumulation boundary, after marking
        each micro-batch with set_gradient_accumulation_boundary(): a backward that follows
        another without a step() in between first ends the earlier micro-step (as a step()
        outside the boundary would)."""
        self._check_alive()
        if not isinstance(loss, torch.Tensor):
            raise ZeroError(f"backward(loss): loss is a {type(loss).__name__}; expected a tensor")
        if loss.grad_fn is None or not loss.requires_grad:
            raise ZeroError("backward(loss): the loss has no autograd graph (requires_grad is "
                            "False): compute it from the engine's output with grad enabled, not "
                            "under torch.no_grad() or after .detach()")
        if loss.numel() != 1:
            raise ZeroError(f"backward(loss): the loss has {loss.numel()} elements; expected a "
                            "scalar (reduce it with .mean() or .sum())")
        if self._backward_open:
            if self._boundary is None:
                raise ZeroError("backward() twice without step() in between: call "
                                "engine.step() after every backward (it runs the optimizer only "
                                "at the accumulation boundary), or mark micro-batches with "
                                "set_gradient_accumulation_boundary() as Accelerate does")
            self._end_micro_step(boundary=False)
        # The engine may step the optimizer during this backward (a window's last micro-step):
        # it learns the boundary and the lr now, not at step().
        if self.is_gradient_accumulation_boundary():
            self._follow_lr()
        call("zero_engine_set_accumulation_boundary", self._handle,
             -1 if self._boundary is None else int(self._boundary))
        scale = ctypes.c_double()
        call("zero_engine_backward_scale", self._handle, ctypes.byref(scale))
        factor = scale.value if scale_wrt_gas else scale.value * self.gradient_accumulation_steps()
        scaled = loss if factor == 1.0 else loss.float() * factor
        scaled.backward(retain_graph=retain_graph)
        self._backward_open = True
        return loss

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Whether the current micro-batch ends an accumulation window (DeepSpeed's; Accelerate
        sets it before every backward): the next step() runs the optimizer if so, whatever the
        count of gradient_accumulation_steps. Stays set until changed."""
        self._boundary = bool(is_boundary)

    def step(self, lr_kwargs=None):
        """Ends the micro-step; at the accumulation boundary the optimizer runs."""
        self._check_alive()
        self._end_micro_step(self._boundary)

    def _end_micro_step(self, boundary):
        """Ends the micro-step: boundary True/False overrides the count; None leaves it to it."""
        if not self._checked:  # the module was called directly, not through forward()
            self._check_unchanged()
        self._checked = False
        if self._fetcher is not None:
            self._fetcher.release_all()
        at_boundary = boundary if boundary is not None else self.is_gradient_accumulation_boundary()
        if at_boundary:
            self._follow_lr(late=self._backward_open)
        call("zero_engine_set_accumulation_boundary", self._handle,
             -1 if boundary is None else int(boundary))
        result = _lib.StepResult()
        call("zero_engine_step", self._handle, ctypes.byref(result))
        self._lent.clear()  # the engine has reduced them (a failed step keeps them until close)
        self._backward_open = False
        self.micro_steps += 1
        self._last_result = result
        if result.boundary:
            self.global_steps = result.global_steps
            self.skipped_steps = result.skipped_steps
            lrs = self.get_lr()  # the next step's
            optimizer = getattr(self, "optimizer", None)
            if optimizer is not None:
                optimizer.refresh(lrs)
            self._sync_lr_sources(lrs)
            if self._client_scheduler is not None and not result.skipped:
                # The engine stepped the optimizer, not optimizer.step(): torch's warning that
                # the scheduler runs first does not apply.
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler")
                    self._client_scheduler.step()

    def _follow_lr(self, late=False):
        """Before an optimizer step (at the boundary's backward, and again at its step()): a
        param group's lr that someone (a client LR scheduler) wrote into an optimizer's
        param_groups becomes the engine's, unless the config's "scheduler" block sets the lr. The
        optimizer initialize returned is asked first.

        `late`: at step(), after the backward. An lr written between backward() and step() is
        one the engine may not have had when it began the step during backward: the step in
        backward is then turned off for good (the new lr is this step's where the step had not
        begun, else the next one's, with a warning), so that from then on every step takes the
        lr written before it, as DeepSpeed's does."""
        if not self._lr_sources or "scheduler" in self.config:
            return
        written = {}
        for g, now in enumerate(self._synced_lrs):
            for source in self._lr_sources:
                lr = float(source.param_groups[g]["lr"])
                if lr != now:
                    written[g] = lr
                    break
        if not written:
            return
        if late:
            begun = ctypes.c_int()
            call("zero_engine_set_step_in_backward", self._handle, 0, ctypes.byref(begun))
            if begun.value:
                warnings.warn(
                    "zero: an lr was written into the optimizer's param_groups between backward() "
                    "and step(), after the engine had begun this step during backward with the lr "
                    f"it had then ({self._synced_lrs}); the new lr ({written}) applies from the "
                    "next step. The step in backward is off from now on, so every later lr "
                    "written before step() is that step's. (Write the lr before backward(), or "
                    "set ZERO_STEP_IN_BACKWARD=0.)", stacklevel=4)
        for g, lr in written.items():
            call("zero_engine_set_lr", self._handle, g, lr)
        self._sync_lr_sources()

    def _sync_lr_sources(self, lrs=None):
        """Every optimizer the engine follows shows the engine's lr (`lrs`, else asked for), so
        that a change written into any of them afterwards is told apart from the others'
        unchanged values."""
        if lrs is None:
            lrs = self.get_lr()
        for source in self._lr_sources:
            for group, lr in zip(source.param_groups, lrs):
                group["lr"] = lr
        self._synced_lrs = lrs

    def zero_grad(self, set_to_none=True):
        for r in self._registered:
            r.param.grad = None

    def is_gradient_accumulation_boundary(self):
        if self._boundary is not None:
            return self._boundary
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    @contextlib.contextmanager
    def no_sync(self):
        """DeepSpeed's no_sync (Accelerate enters it at stages 0-1 between boundaries). zero
        reduces every micro-step's gradients at every stage, which keeps the stages bitwise
        equal, so there is nothing to skip: the context changes nothing."""
        yield

    def was_step_applied(self):
        return self._last_result is not None and bool(self._last_result.boundary) and not bool(
            self._last_result.skipped)

    # --- what the engine is ---
    def train_batch_size(self):
        return int(self._info.train_batch_size)

    def train_micro_batch_size_per_gpu(self):
        return int(self._info.train_micro_batch_size_per_gpu)

    def gradient_accumulation_steps(self):
        return int(self._info.gradient_accumulation_steps)

    def zero_optimization_stage(self):
        return int(self._info.stage)

    @property
    def global_rank(self):
        return int(self._info.rank)

    @property
    def world_size(self):
        return int(self._info.world_size)

    @property
    def dp_world_size(self):
        return int(self._info.world_size)

    def get_lr(self):
        out = []
        for g in range(self._info.num_groups):
            lr = ctypes.c_double()
            call("zero_engine_lr", self._handle, g, ctypes.byref(lr))
            out.append(lr.value)
        return out

    def get_global_grad_norm(self):
        r = self._last_result
        return None if r is None or not r.boundary else r.grad_norm

    def loss_scale(self):
        s = ctypes.c_double()
        call("zero_engine_loss_scale", self._handle, ctypes.byref(s))
        return s.value

    cur_scale = property(loss_scale)

    def memory(self):
        """This rank's memory ledger (a dict)."""
        p = ctypes.c_void_p()
        call("zero_engine_memory_json", self._handle, ctypes.byref(p))
        return json.loads(take_string(p))

    def timings(self, reset=False):
        """Where this rank's engine spent its time (a dict of seconds and counts): the C++
        engine's phases, and under "python" the package's own work (the gradient hooks, the
        parameter checks). reset: start counting anew after reading."""
        p = ctypes.c_void_p()
        call("zero_engine_timings_json", self._handle, ctypes.byref(p))
        out = json.loads(take_string(p))
        out["python"] = dict(self._py_timings)
        if reset:
            call("zero_engine_reset_timings", self._handle)
            self._py_timings = dict(PY_TIMINGS)
        return out

    def gather_master(self, name):
        """The fp32 master value of parameter `name` (collective at stages 1-3)."""
        for r in self._registered:
            if r.name == name or name in r.tied_names:
                out = torch.empty(r.shape, dtype=torch.float32)
                call("zero_engine_gather_master", self._handle, r.index,
                     ctypes.c_void_p(out.data_ptr()), r.numel)
                return out
        raise ZeroError(f"gather_master: no parameter named '{name}'")

    def _set_param(self, index, values, root):
        """Parameter `index` becomes `values` (a float32 tensor, read on rank `root` only):
        master weights and model copy (collective; GatheredParameters' modifier_rank)."""
        self._check_alive()
        if self.global_rank == root:
            values = values.detach().reshape(-1).to(torch.float32).cpu().contiguous()
            call("zero_engine_set_param", self._handle, index, ctypes.c_void_p(values.data_ptr()),
                 values.numel(), root)
        else:
            call("zero_engine_set_param", self._handle, index, None, 0, root)

    # --- lifetime ---
    def _check_alive(self):
        if self._handle is None:
            raise ZeroError("this engine was closed")

    def destroy(self):
        """DeepSpeed's name for close()."""
        self.close()

    def close(self):
        """Frees the engine. The model's parameters get their own memory back (a copy of their
        current values at stages 0-2; stage 3 placeholders stay empty). Where the ranks share one
        model copy (stages 1/2 over processes) the engine is then freed at a barrier with the
        other ranks, after each has copied its parameters out."""
        if self._handle is None:
            return
        for h in self._grad_hooks:
            h.remove()
        self._grad_hooks.clear()
        if self._fetcher is not None:
            self._fetcher.remove_hooks()
        else:
            for r in self._registered:
                r.param.data = r.param.data.clone()
        _lib.lib.zero_engine_destroy(self._handle)
        self._handle = None
        self._lent.clear()
        self._comm.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


