"""What every rank of a test launch does alike: its options, rank and world (rank_args), and an
exception anywhere in it written to OUT/error.rank<R>.json (type, message, traceback), where the
test reads it (harness.launch_checked), then raised again, so the rank exits 1."""
import argparse
import contextlib
import json
import os
import traceback


@contextlib.contextmanager
def errors_reported(out, rank):
    try:
        yield
    except BaseException as e:  # noqa: BLE001 - reported to the test, then re-raised
        with open(os.path.join(out, f"error.rank{rank}.json"), "w") as f:
            json.dump({"type": type(e).__name__, "message": str(e),
                       "traceback": traceback.format_exc()}, f)
        raise


def rank_args(*required):
    """This rank's --NAME options (each required), its rank and world size (torchrun's
    environment), with torch on one thread: (args, rank, world)."""
    import torch

    p = argparse.ArgumentParser()
    for name in required:
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    return args, int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
