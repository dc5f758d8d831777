"""zero.Init: build a model already partitioned for ZeRO stage 3, as deepspeed.zero.Init does.

Inside the context every torch module, once its outermost __init__ returns, gives up its own
parameters: rank 0's values go to every rank, and each rank keeps one contiguous 1/world slice of
each flattened parameter (param.ds_tensor, zero-padded at the end); param.data becomes an empty
tensor. So no rank holds more than the module being built. The parameter remembers what it was
(ds_shape, ds_numel, ds_id, ds_status). Module.apply(fn) inside the context gathers each module's
parameters for fn and keeps rank 0's result, and GatheredParameters(params, modifier_rank=...)
gathers such parameters outside it, as DeepSpeed's do, so initialisation code written for
DeepSpeed (Hugging Face's initialize_weights under ZeRO-3) gives DeepSpeed's initial weights.

zero.initialize takes such a model at any stage: it registers each parameter by its ds_shape
and gathers its values one parameter at a time into the engine, which then owns them.

Collectives run over torch.distributed's default group, made over the launcher's environment (or
one rank) on entry when it does not exist yet. The context does not change tensor dtypes or
devices: the engine casts the model to the config's precision at initialize."""
import enum
import functools
import itertools

import torch

from ._lib import ZeroError


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's names for where a partitioned parameter's full value is."""
    AVAILABLE = 1      # param.data holds the whole value
    NOT_AVAILABLE = 2  # only this rank's slice, in param.ds_tensor
    INFLIGHT = 3


_ids = itertools.count()


def is_partitioned_param(param):
    """Whether `param` was built under zero.Init (and not yet handed to an engine)."""
    return getattr(param, "ds_tensor", None) is not None


def _dist():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _world():
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist is not None else (0, 1)


def _slice_of(flat, rank, world):
    """This rank's slice of a flattened value: ceil(numel / world) elements, zero-padded."""
    per = -(-flat.numel() // world) if flat.numel() else 0
    part = torch.zeros(per, dtype=flat.dtype, device=flat.device)
    start = min(rank * per, flat.numel())
    end = min(start + per, flat.numel())
    part[:end - start] = flat[start:end]
    return part


def broadcast_(tensor, root):
    """Every rank's `tensor` becomes rank `root`'s (in place; a no-op on one rank)."""
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1 and tensor.numel():
        dist.broadcast(tensor, root)


def partition(param, keep_values=True, root=0):
    """Rank `root`'s value of `param` goes to every rank (keep_values), each rank keeps its slice,
    and param.data becomes empty. A parameter partitioned before is marked NOT_AVAILABLE again; with
    keep_values=False its old slice stays (changes made while gathered are dropped)."""
    rank, world = _world()
    if not hasattr(param, "ds_id"):
        param.ds_id = next(_ids)
        param.ds_shape = tuple(param.shape)
        param.ds_numel = param.numel()
        param.all_gather = functools.partial(gather, param)
        param.partition = functools.partial(partition, param)
        param.ds_summary = functools.partial(_summary, param)
        keep_values = True
    if keep_values or param.ds_tensor is None:
        with torch.no_grad():
            full = param.data.detach().reshape(-1).contiguous()
            broadcast_(full, root)
            param.ds_tensor = _slice_of(full, rank, world)
    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    param.ds_status = ZeroParamStatus.NOT_AVAILABLE


def gather(param):
    """param.data holds the whole value again, gathered from every rank's slice. Collective."""
    if param.ds_status == ZeroParamStatus.AVAILABLE:
        return
    dist = _dist()
    part = param.ds_tensor
    if dist is not None and dist.get_world_size() > 1:
        parts = [torch.empty_like(part) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, part)
        flat = torch.cat(parts)
    else:
        flat = part
    param.data = flat[:param.ds_numel].clone().view(param.ds_shape)
    param.ds_status = ZeroParamStatus.AVAILABLE


def release(param):
    """After the engine took `param` over: the slice is dropped."""
    for name in ("ds_tensor", "all_gather", "partition"):
        if hasattr(param, name):
            setattr(param, name, None)


def _summary(param):
    return {"id": param.ds_id, "status": param.ds_status.name, "shape": param.ds_shape,
            "numel": param.ds_numel}


class Init:
    """deepspeed.zero.Init's context. config_dict_or_path, config, dtype, remote_device,
    pin_memory, mpu and the other DeepSpeed arguments are accepted and not needed: zero reads the
    config at initialize. module=: partition an existing module's parameters now. enabled=False:
    the context does nothing."""

    _depth = 0  # nested contexts: the outermost one patches torch

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None, config=None,
                 enabled=True, dtype=None, mpu=None, **_deepspeed_only):
        self.enabled = enabled
        if mpu is not None:
            raise ZeroError("zero.Init: mpu (model parallelism) is not supported; zero is "
                            "data-parallel only")
        if remote_device not in (None, "cpu", "none"):
            raise ZeroError(f"zero.Init: remote_device={remote_device!r}: zero keeps the slices "
                            "where the model is built and offloads through the config at "
                            "initialize; pass None")
        if enabled:
            _ensure_process_group()
        if module is not None and enabled:
            for p in module.parameters():
                if not is_partitioned_param(p):
                    partition(p)

    def __enter__(self):
        if not self.enabled:
            return self
        if Init._depth == 0:
            _patch()
        Init._depth += 1
        return self

    def __exit__(self, *exc):
        if self.enabled:
            Init._depth -= 1
            if Init._depth == 0:
                _unpatch()
        return False


def _ensure_process_group():
    if _dist() is None:
        from ._deepspeed.comm import init_distributed
        init_distributed()


# --- what the context changes in torch while it is open ---

_saved = {}


def _post_init(module):
    """After a module's outermost __init__: its own parameters are partitioned."""
    for p in module.parameters(recurse=False):
        if not hasattr(p, "ds_id"):
            partition(p)


def _partition_after(init):
    @functools.wraps(init)
    def wrapper(module, *args, **kwargs):
        # A subclass's __init__ runs its bases' through super(): only the outermost one, the first
        # entered, partitions, once the whole object is built.
        outermost = not getattr(module, "_zero_init_entered", False)
        if outermost:
            object.__setattr__(module, "_zero_init_entered", True)
        try:
            init(module, *args, **kwargs)
        finally:
            if outermost:
                object.__delattr__(module, "_zero_init_entered")
        if outermost:
            _post_init(module)
    wrapper._zero_wrapped = init
    return wrapper


def _wrap_class(cls):
    init = cls.__dict__.get("__init__")
    if init is not None and not hasattr(init, "_zero_wrapped"):
        cls.__init__ = _partition_after(init)


def _unwrap_class(cls):
    init = cls.__dict__.get("__init__")
    if init is not None and hasattr(init, "_zero_wrapped"):
        cls.__init__ = init._zero_wrapped


def _subclasses(cls):
    seen, todo = [], [cls]
    while todo:
        c = todo.pop()
        for s in c.__subclasses__():
            if s not in seen:
                seen.append(s)
                todo.append(s)
    return seen


def _apply_gathering(original):
    """Module.apply inside the context: fn sees each module's own parameters whole, and rank 0's
    result is kept (DeepSpeed's override_module_apply)."""
    @functools.wraps(original)
    def apply(self, fn):
        if getattr(fn, "_zero_gathering", False):  # apply recursing into a child
            return original(self, fn)

        def gathered_fn(module):
            params = [p for p in module.parameters(recurse=False) if is_partitioned_param(p)]
            params.sort(key=lambda p: p.ds_id)
            for p in params:
                gather(p)
            fn(module)
            for p in params:
                partition(p, keep_values=True)
        gathered_fn._zero_gathering = True
        return original(self, gathered_fn)
    return apply


def _patch():
    module_cls = torch.nn.Module
    for cls in [module_cls] + _subclasses(module_cls):
        _wrap_class(cls)
    _saved["init_subclass"] = module_cls.__dict__.get("__init_subclass__")
    _saved["apply"] = module_cls.apply

    def init_subclass(cls, **kwargs):
        super(module_cls, cls).__init_subclass__(**kwargs)
        _wrap_class(cls)
    module_cls.__init_subclass__ = classmethod(init_subclass)
    module_cls.apply = _apply_gathering(module_cls.apply)


def _unpatch():
    module_cls = torch.nn.Module
    for cls in [module_cls] + _subclasses(module_cls):
        _unwrap_class(cls)
    if _saved.get("init_subclass") is None:
        del module_cls.__init_subclass__
    else:
        module_cls.__init_subclass__ = _saved["init_subclass"]
    module_cls.apply = _saved["apply"]
    _saved.clear()
