"""Gradients lent to the engine over processes (zero_engine_grad_lend): where the optimizer step
sums the ranks' gradients itself (the fused reduction, the step in backward), a peer process
cannot read autograd's tensor, so only the slices the peers read are copied into shared memory
and each rank reads its own slice where autograd wrote it. Trained bitwise as with every
gradient copied, at every stage, with and without accumulation (worker_lend.py)."""
import pytest
import torch

import harness
from harness import assert_bitwise, assert_trained

import worker_lend

# (stage, accumulation, reduce_bucket_size or 0): with the small bucket and overlap_comm, stage 3
# reduces the older lone units during backward (each rank's own slice copied in for the
# collective) and leaves the newest to the step.
RUNS = [(0, 1, 0), (1, 1, 0), (2, 2, 0), (3, 1, 0), (3, 2, 0), (3, 1, 70000)]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("lend")
    runs = ",".join(f"{s}:{g}:{b}" if b else f"{s}:{g}" for s, g, b in RUNS)
    harness.launch_checked(2, "worker_lend.py", ["--out", out, "--runs", runs], TIMEOUT_S, out,
                           "lending launch")
    return out


@pytest.mark.parametrize("stage,gas,bucket", RUNS)
def test_lent_gradients_train_bitwise_as_copied_over_processes(launch, stage, gas, bucket):
    name = worker_lend.run_name(stage, gas, bucket)
    lent = harness.load_st(launch / f"{name}-lent.safetensors")
    copied = harness.load_st(launch / f"{name}-copied.safetensors")
    initial = {n: p.detach().clone() for n, p in worker_lend.make_model().named_parameters()}
    what = f"stage {stage}, accumulation {gas}" + (f", reduce_bucket_size {bucket}" if bucket else "")
    assert_trained(copied, initial, what)  # not vacuous: every tensor moved
    assert_bitwise(lent, copied, what + ", lent against copied")
    for rank in (0, 1):
        counts = harness.read_json(launch / f"{name}-lent.rank{rank}.json")
        assert harness.read_json(launch / f"{name}-copied.rank{rank}.json")["lent"] == 0
        # The three square weights are lent in the boundary's micro-step of every step (at stage
        # 0 from the second on: its step is shared out from then), where the step sums them.
        boundary_steps = worker_lend.STEPS - 1 if stage == 0 else worker_lend.STEPS
        per_micro = worker_lend.LENT
        assert counts["lent_at_boundary"] == per_micro * boundary_steps, (what, rank, counts)
        assert counts["lent"] == per_micro * (boundary_steps + worker_lend.STEPS * (gas - 1)), \
            (what, rank, counts)
