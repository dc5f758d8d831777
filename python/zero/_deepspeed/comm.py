"""deepspeed.comm: the process group. accelerate and transformers call init_distributed and
then torch.distributed directly, so it makes torch's default process group (gloo on the CPU,
nccl on a GPU) over the launcher's environment, or over one local rank when there is none. zero's
engine has its own communicator; this group serves the caller's own collectives.

A gloo group still alive when the interpreter exits can abort the process ("terminate called
without an active exception": its worker threads outlive the interpreter; pytorch issue 190489),
and scripts written for DeepSpeed, the Hugging Face Trainer among them, never destroy it. So
init_distributed destroys a gloo default group at exit, while the interpreter is whole."""
import atexit
import datetime
import os
import socket

import torch.distributed as dist


def is_initialized():
    return dist.is_available() and dist.is_initialized()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500,
                     verbose=True, timeout=datetime.timedelta(minutes=30), init_method=None,
                     dist_init_required=None, config=None, rank=-1, world_size=-1):
    """Creates torch's default process group unless it exists (DeepSpeed's signature)."""
    atexit.unregister(_destroy_gloo_group)  # once, however often it is called
    atexit.register(_destroy_gloo_group)
    if is_initialized():
        return
    import torch
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        dist.init_process_group(backend=backend, init_method=init_method or "env://",
                                timeout=timeout)
        return
    # No launcher: one rank in this process (DeepSpeed's single-process default).
    dist.init_process_group(backend=backend,
                            init_method=init_method or f"tcp://127.0.0.1:{_free_port()}",
                            rank=0 if rank < 0 else rank,
                            world_size=1 if world_size < 0 else world_size, timeout=timeout)


def _destroy_gloo_group():
    """At exit: destroys the default process group if it is a gloo one still alive (a local
    teardown; an nccl group's may wait on its peers, so it is left to torch)."""
    try:
        if is_initialized() and dist.get_backend() == "gloo":
            dist.destroy_process_group()
    except Exception:  # exiting anyway: a group torch cannot tear down is no reason to fail
        pass


def get_rank(group=None):
    return dist.get_rank(group) if is_initialized() else int(os.environ.get("RANK", "0"))


def get_world_size(group=None):
    return dist.get_world_size(group) if is_initialized() else int(
        os.environ.get("WORLD_SIZE", "1"))


def get_local_rank():
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier(group=None):
    if is_initialized():
        dist.barrier(group)
