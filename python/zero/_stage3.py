"""Stage 3 in a torch module: parameters are empty placeholders until a module runs.

A forward pre-hook gathers the units of a module's own parameters (its large parameters are units
of their own, its small ones share one; tied ones included) and
points their .data at the gathered copy; the forward hook releases them when no other running
module needs them. A module may also read another module's parameters without calling it
(nn.MultiheadAttention reads out_proj.weight): reading a stage-3 parameter as a module
attribute gathers its unit, which the running module then releases with its own. Autograd would keep the gathered memory alive through what it saves for
backward (nn.Linear saves weight.t(), a view of it): during the engine's forward a
saved-tensors hook replaces every saved tensor that views a gathered parameter by a token
(parameter, size, stride, offset), and backward re-gathers the unit when it unpacks one. A unit the
engine keeps at forward's release (its trace gathers it again soon, within
stage3_max_reuse_distance) stays bound to the kept copy, so that re-gather has nothing to bind. Native
autograd runs unchanged, so stage 3 computes bitwise what stages 0-2 compute. A unit is released
in backward once every trainable parameter in it has handed its gradient to the engine; whatever
is still gathered at step() is released then. Persistence
thresholds, trace prefetch and the live cap are the engine's (gather() prefetches). A persistent
unit (under the persistence thresholds) stays gathered where it is for the engine's life, each
step refreshing it in place: its parameters are views of it from the start, and its modules get
no hooks. Over processes of one host every unit is persistent where the ranks share one copy of
the model (the engine decides; ZERO_SHARED_MODEL=0 turns it off): then nothing here runs per step."""
import contextlib
import ctypes
import os

import torch

from ._lib import bind
from ._memory import current_stream_getter, tensor_at


class UnitFetcher:
    def __init__(self, handle, registered, torch_dtype, device):
        self.handle = handle
        self.dtype = torch_dtype
        self.device = device
        self.params_of = {}  # unit -> [Registered]
        for r in registered:
            self.params_of.setdefault(r.unit, []).append(r)
        self.gathered = set()  # units in use: gathered and not released since
        # Units released that the engine kept gathered (zero_engine_release_kept: its trace uses
        # them again soon): their parameters still view the engine's copy, which stays where it
        # is, so the next gather (most often backward's, re-gathering what forward released) has
        # nothing to bind. Released for good at release_all().
        self.kept = set()
        self.forward_refs = {}
        self.pending = {}  # unit -> trainable params still to hand in their gradient
        self.by_storage = {}  # storage address of a gathered parameter -> its Registered
        self.storages_of = {}  # gathered unit -> its parameters' keys in by_storage
        self.hooks = []
        self.running = []  # per running module (innermost last): units it borrowed
        # Made once per parameter, not per gather or release (each costs more than a small
        # parameter's gather): the placeholder, and the tensor over each address its gathered
        # copy has had.
        self.placeholders = {r.index: self._placeholder(r) for r in registered}
        self.views = {r.index: {} for r in registered}  # index -> {(ptr, nbytes): tensor}
        self.current = {}  # index -> the tensor over its gathered copy (set at each gather)
        if device.type == "cuda" and os.environ.get("ZERO_GATHER_ON_STREAM", "1") != "0":
            # On a GPU the all-gather is waited for by torch's current stream, on the GPU, not by
            # the host (zero_engine_gather_on_stream): the forward keeps running ahead.
            # ZERO_GATHER_ON_STREAM=0 waits on the host, for comparison.
            gather_on, stream = bind("zero_engine_gather_on_stream"), current_stream_getter(device)
            self._gather = lambda h, unit: gather_on(h, unit, stream())
        else:
            self._gather = bind("zero_engine_gather")
        self._release = bind("zero_engine_release_kept")
        self._kept_flag = ctypes.c_int()
        self._kept_ref = ctypes.byref(self._kept_flag)
        self._param = bind("zero_engine_param")
        self._ptr, self._nbytes = ctypes.c_void_p(), ctypes.c_size_t()
        self._ptr_ref, self._nbytes_ref = ctypes.byref(self._ptr), ctypes.byref(self._nbytes)
        unit_persistent, flag = bind("zero_engine_unit_persistent"), ctypes.c_int()
        self.persistent = set()
        for u in self.params_of:
            unit_persistent(handle, u, ctypes.byref(flag))
            if flag.value:
                self.persistent.add(u)
        # Whether any unit is gathered per use. Over processes of one host the ranks may share
        # one copy of every unit (the engine's shared model): all are persistent, and nothing here
        # hooks a module, watches an attribute read or packs a saved tensor.
        self.gathers = any(u not in self.persistent for u in self.params_of)
        self._watching = False
        for r in registered:
            r.param.ds_shape, r.param.ds_numel = r.shape, r.numel
            r.param._zero_fetcher, r.param._zero_unit = self, r.unit
            if r.unit in self.persistent:
                # The engine's copy, which stays where it is for the engine's life
                # (zero_engine_unit_persistent): bound once, never gathered or released here.
                r.param.data, _ = self._view(r)
            else:
                r.param.data = self.placeholders[r.index]

    def _placeholder(self, r):
        """What a released parameter holds: its shape over one element (stride 0), so that
        autograd can accumulate its gradient without gathering it. Its values are meaningless."""
        if not r.shape:
            return torch.zeros((), dtype=self.dtype, device=self.device)
        return torch.zeros(1, dtype=self.dtype, device=self.device).expand(r.shape)

    def _view(self, r):
        """(the tensor over r's gathered copy, its storage address or None when empty)."""
        self._param(self.handle, r.index, self._ptr_ref, self._nbytes_ref)
        where = (self._ptr.value, self._nbytes.value)
        made = self.views[r.index]
        view = made.get(where)
        if view is None:
            if len(made) >= 4:  # the engine's buffers move rarely: keep the last few
                made.clear()
            view = made[where] = (tensor_at(where[0], where[1], self.dtype, r.shape, self.device),
                                  where[0] if where[1] else None)
        return view

    def is_persistent(self, param):
        """Whether `param` is this fetcher's and views a persistent unit's copy for good."""
        return getattr(param, "_zero_fetcher", None) is self and param._zero_unit in self.persistent

    def rebind(self, param):
        """A persistent parameter whose .data was replaced views the engine's copy again."""
        for r in self.params_of.get(param._zero_unit, []):
            if r.param is param:
                r.param.data, _ = self._view(r)

    # --- units ---
    def ensure_gathered(self, unit):
        if unit in self.gathered or unit in self.persistent:
            return
        # A kept unit is gathered too (the engine's trace and order check see every use), but
        # its parameters already view the copy.
        self._gather(self.handle, unit)
        self.gathered.add(unit)
        params = self.params_of.get(unit, [])
        if unit in self.kept:
            self.kept.discard(unit)
        else:
            keys = self.storages_of[unit] = []
            for r in params:
                tensor, key = self._view(r)
                r.param.data = self.current[r.index] = tensor
                if key is not None:
                    self.by_storage[key] = r
                    keys.append(key)
        self.pending[unit] = {r.index for r in params if r.trainable}

    def release(self, unit):
        if unit not in self.gathered:
            return
        self.gathered.discard(unit)
        self._release(self.handle, unit, self._kept_ref)
        if self._kept_flag.value:
            self.kept.add(unit)
        else:
            self._unbind(unit)

    def _unbind(self, unit):
        """The unit's parameters back to their placeholders: none views the engine's copy."""
        for key in self.storages_of.pop(unit, ()):
            self.by_storage.pop(key, None)
        for r in self.params_of.get(unit, []):
            r.param.data = self.placeholders[r.index]

    def release_all(self):
        """Every unit released and unbound, the kept ones released again so that the engine
        frees them (an optimizer step or checkpoint load would anyway)."""
        for u in sorted(self.gathered | self.kept):
            self._release(self.handle, u, self._kept_ref)
            self._unbind(u)
        self.gathered.clear()
        self.kept.clear()
        self.forward_refs.clear()
        self.running.clear()

    def on_access(self, unit):
        """A stage-3 parameter of `unit` was read as a module attribute."""
        if unit in self.gathered or unit in self.persistent:
            return
        self.ensure_gathered(unit)
        if self.running:
            self.running[-1].append(unit)
            self.forward_refs[unit] = self.forward_refs.get(unit, 0) + 1

    def grad_done(self, r):
        """Trainable parameter r handed in its gradient: release its unit once all have."""
        left = self.pending.get(r.unit)
        if left is None:
            return
        left.discard(r.index)
        if not left and self.forward_refs.get(r.unit, 0) == 0:
            self.release(r.unit)

    # --- hooks ---
    def install(self, model, unit_of_param):
        if not self.gathers:
            return
        _watch_attribute_reads(True)
        self._watching = True
        for module in model.modules():
            units = sorted({unit_of_param[id(p)] for p in module.parameters(recurse=False)}
                           - self.persistent)
            if units:
                self.hooks.append(module.register_forward_pre_hook(self._pre_hook(units)))
                self.hooks.append(module.register_forward_hook(self._post_hook(units)))

    def remove_hooks(self):
        if self._watching:
            _watch_attribute_reads(False)
            self._watching = False
        for h in self.hooks:
            h.remove()
        self.hooks.clear()
        for params in self.params_of.values():
            for r in params:
                r.param._zero_fetcher = None
                # The engine's memory goes with it: no parameter may view it afterwards.
                r.param.data = self.placeholders[r.index]
        self.gathered.clear()
        self.kept.clear()

    def _pre_hook(self, units):
        def hook(module, inputs):
            self.running.append([])
            for u in units:
                self.forward_refs[u] = self.forward_refs.get(u, 0) + 1
                self.ensure_gathered(u)
        return hook

    def _post_hook(self, units):
        def hook(module, inputs, output):
            borrowed = self.running.pop() if self.running else []
            for u in list(units) + borrowed:
                self.forward_refs[u] -= 1
                if self.forward_refs[u] == 0:
                    self.release(u)
        return hook

    # --- what autograd saves ---
    def saved_tensors_hooks(self):
        """The context the engine's forward runs in (see the module docstring)."""
        if not self.gathers:
            return contextlib.nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t):
        if t.layout != torch.strided or t.device != self.device:
            return t
        r = self.by_storage.get(t.untyped_storage().data_ptr())
        if r is None:
            return t
        return (_SavedView, r, tuple(t.size()), tuple(t.stride()), t.storage_offset())

    def _unpack(self, packed):
        if not (isinstance(packed, tuple) and packed and packed[0] is _SavedView):
            return packed
        _, r, size, stride, offset = packed
        self.ensure_gathered(r.unit)
        return self.current[r.index].as_strided(size, stride, offset)


class _SavedView:
    """Marks a packed saved tensor: a view of a stage-3 parameter, re-gathered on unpack."""


def live_fetcher_of(param):
    """(the UnitFetcher of the live stage-3 engine holding `param`, its unit) or (None, None)."""
    fetcher = getattr(param, "_zero_fetcher", None)
    return (fetcher, param._zero_unit) if fetcher is not None else (None, None)


_original_getattr = torch.nn.Module.__getattr__
_watchers = 0


def _getattr_watching_stage3(module, name):
    value = _original_getattr(module, name)
    # isinstance(value, Parameter) runs Python (its metaclass); most reads are of submodules.
    if isinstance(value, torch.Tensor):
        fetcher = getattr(value, "_zero_fetcher", None)
        if fetcher is not None:
            fetcher.on_access(value._zero_unit)
    return value


def _watch_attribute_reads(on):
    """Routes module attribute reads of parameters through _getattr_watching_stage3 while any
    stage-3 engine is alive (nn.Module.__getattr__ serves every parameter read)."""
    global _watchers
    _watchers += 1 if on else -1
    torch.nn.Module.__getattr__ = _getattr_watching_stage3 if _watchers > 0 else _original_getattr
