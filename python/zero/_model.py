"""What the engine needs to know of a torch module: its parameters as specs (names, shapes,
dtypes, param groups, stage-3 units, frozen and tied names), and the checks that nothing about
them changed after initialize; the device the module is on."""
import math
from dataclasses import dataclass, field

import torch

from ._lib import BF16, F16, F32, ZeroError
from .partitioned_init import is_partitioned_param

TORCH_DTYPES = {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}
DTYPE_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16"}


@dataclass
class Registered:
    """One engine parameter: the torch Parameter and everything the engine was told of it."""
    index: int
    name: str
    param: torch.nn.Parameter
    shape: tuple
    numel: int
    unit: int
    group: int
    trainable: bool
    tied_names: list = field(default_factory=list)


def training_dtype(config):
    """The model dtype a DeepSpeed config asks for: bf16 ("bf16" or "bfloat16" enabled), fp16,
    else fp32."""
    def enabled(key):
        block = config.get(key)
        return isinstance(block, dict) and block.get("enabled") is True
    if enabled("bf16") or enabled("bfloat16"):
        return BF16
    if enabled("fp16"):
        return F16
    return F32


def param_groups(model, model_parameters):
    """{id(param): group index} and the groups' overrides [(lr or nan, weight_decay or nan)], from
    `model_parameters` as DeepSpeed takes it: None (every parameter of the model), an iterable
    of parameters, or a list of param-group dicts ({"params": [...], "lr": .., ...})."""
    if model_parameters is None:
        return {id(p): 0 for p in model.parameters()}, []
    items = list(model_parameters)
    if not items:
        raise ZeroError("model_parameters is empty: pass model.parameters() or param groups")
    if not isinstance(items[0], dict):
        return {id(p): 0 for p in items}, []
    groups, overrides = {}, []
    for g, group in enumerate(items):
        if not isinstance(group, dict) or "params" not in group:
            raise ZeroError(f"model_parameters[{g}] is not a param group dict with 'params'")
        for p in group["params"]:
            groups.setdefault(id(p), g)
        overrides.append((float(group.get("lr", math.nan)),
                          float(group.get("weight_decay", math.nan))))
    return groups, overrides


# A parameter of at least this many elements is a unit of its own (the reducer's threshold for
# reducing a unit alone on one rank, GradientReducer::kAloneMinSliceElems): the engine can then
# reduce its gradient in the tensor autograd wrote (zero_engine_grad_lend) instead of copying it
# into a unit-wide staging buffer beside its module's other parameters.
OWN_UNIT_MIN_NUMEL = 1 << 14


def register(model, model_parameters, dtype):
    """The model's parameters as Registered entries, in named_parameters() order. The units (what
    stage 3 gathers together, and what the reducer reduces together): each parameter of at least
    OWN_UNIT_MIN_NUMEL elements is one, and the smaller parameters a module owns directly share
    one. A parameter tied into several modules belongs to the first and lists its other names."""
    names = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    if not names:
        raise ZeroError(f"the model ({type(model).__name__}) has no parameters: zero has "
                        "nothing to optimize")
    groups, overrides = param_groups(model, model_parameters)
    unit_of, units = {}, 0
    for _, module in model.named_modules():
        small = None  # the unit of this module's small parameters, made at the first
        for p in module.parameters(recurse=False):
            if id(p) in unit_of:
                continue
            if _numel(p) >= OWN_UNIT_MIN_NUMEL:
                unit_of[id(p)], units = units, units + 1
            else:
                if small is None:
                    small, units = units, units + 1
                unit_of[id(p)] = small
    out = []
    for name, p in model.named_parameters():
        if not p.dtype.is_floating_point:
            raise ZeroError(f"parameter '{name}' has dtype {p.dtype}; the config's precision "
                            f"({DTYPE_NAMES[dtype]}) holds only floating-point parameters: make "
                            "it a buffer (register_buffer) or a float parameter")
        trainable = p.requires_grad
        if trainable and id(p) not in groups:
            raise ZeroError(f"parameter '{name}' is trainable but not in model_parameters: pass "
                            "every trainable parameter, or set requires_grad=False on it")
        shape = _shape(p)
        out.append(Registered(index=len(out), name=name, param=p, shape=shape,
                              numel=math.prod(shape), unit=unit_of[id(p)],
                              group=groups.get(id(p), 0),
                              trainable=trainable, tied_names=names[id(p)][1:]))
    return out, overrides, units


def _shape(p):
    """A parameter's shape; built under zero.Init, the shape it had before it was partitioned."""
    return tuple(p.ds_shape) if is_partitioned_param(p) else tuple(p.shape)


def _numel(p):
    return math.prod(_shape(p))


def snapshot(model):
    """The module's parameter set, to see later whether it changed: [(name, id)]."""
    return [(name, id(p)) for name, p in model.named_parameters()]


class ModuleTree:
    """The module tree as initialize saw it: each module with the ids of its own parameters and
    children, in order. If they are all still the same, so is every parameter and its name, and
    check_unchanged needs no walk of named_parameters() (its cost per call on a transformer is
    most of the check's)."""

    def __init__(self, model):
        self.take(model)

    def take(self, model):
        self.nodes = [(m, self._ids(m)) for m in model.modules()]

    @staticmethod
    def _ids(module):
        return ([id(p) for p in module._parameters.values()],
                [id(c) for c in module._modules.values()])

    def unchanged(self):
        return all(self._ids(m) == ids for m, ids in self.nodes)


def _raise_for_changed_names(before, after):
    """Raises ZeroError naming the first parameter added, removed or replaced between two
    snapshots."""
    before, after = dict(before), dict(after)
    for name in after.keys() - before.keys():
        raise ZeroError(f"parameter '{name}' was added to the model after zero.initialize; "
                        "build the whole model first, then call zero.initialize")
    for name in before.keys() - after.keys():
        raise ZeroError(f"parameter '{name}' was removed from the model after zero.initialize")
    for name in before:
        if before[name] != after[name]:
            raise ZeroError(f"parameter '{name}' was replaced after zero.initialize (a new "
                            "torch.nn.Parameter was assigned); the engine still trains the old "
                            "one. Modify parameters in place, before zero.initialize")


def check_unchanged(model, expected, registered, views, tree=None):
    """Raises ZeroError naming the first parameter added, removed or replaced since initialize,
    or whose .data no longer is the engine's memory (views: index -> expected data_ptr or None
    when not aliased). tree: the ModuleTree of initialize, whose check is enough when it holds;
    when the tree changed without changing the parameters (a module without parameters added),
    it is taken anew."""
    if tree is None or not tree.unchanged():
        now = snapshot(model)
        if now != expected:
            _raise_for_changed_names(expected, now)
        if tree is not None:
            tree.take(model)  # the parameters are the same: only the tree around them changed
    for r in registered:
        ptr = views.get(r.index)
        if ptr is not None and r.param.data_ptr() != ptr:
            raise ZeroError(f"parameter '{r.name}'.data was reassigned after zero.initialize; "
                            "the engine owns its memory. Modify it in place (param.data.copy_(...))"
                            " or before zero.initialize")


def model_device(model):
    """The one device every parameter of `model` is on: the CPU or a CUDA GPU."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        names = ", ".join(sorted(map(str, devices)))
        raise ZeroError(f"the model's parameters are on several devices ({names}): move the whole "
                        "model to one device (model.to(...)) before zero.initialize")
    device = next(iter(devices)) if devices else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise ZeroError(f"the model is on {device}; zero trains models on the CPU or on a CUDA GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
