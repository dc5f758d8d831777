"""Gradient accumulation through zero.initialize keeps ZeRO stages 0-3 bitwise equal (issue 30):
a recurrent model with an embedding, a parameter used twice per forward and one without a
gradient in some micro-batches, accumulation 2 and 3, fp32 and bf16, on 2 and 3 processes. One
torchrun per world size trains every combination (worker_accum.py)."""
import pytest
import torch

import cases
import harness
from harness import assert_bitwise, assert_trained

ACCUMULATIONS = (2, 3)
DTYPES = ("fp32", "bf16")
STAGES = (0, 1, 2, 3)
RUNS = [(g, d, s) for g in ACCUMULATIONS for d in DTYPES for s in STAGES]
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    cache = {}

    def get(world):
        if world not in cache:
            out = tmp_path_factory.mktemp(f"accum-w{world}")
            runs = ",".join(f"{g}:{d}:{s}" for g, d, s in RUNS)
            harness.launch_checked(world, "worker_accum.py", ["--out", out, "--runs", runs],
                                   TIMEOUT_S, out, f"accumulation launch on {world} ranks")
            cache[world] = out
        return cache[world]

    return get


def initial_weights():
    torch.manual_seed(cases.ACCUM_SEED)
    return {n: p.detach().clone() for n, p in cases.RecurrentLM().named_parameters()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gas", ACCUMULATIONS)
@pytest.mark.parametrize("world", (2, 3))
def test_stages_are_bitwise_equal_with_accumulation(launches, world, gas, dtype):
    out = launches(world)
    stage0 = harness.load_st(out / f"{gas}-{dtype}-0.safetensors")
    what = f"{world} ranks, accumulation {gas}, {dtype}"
    # Not vacuous: every tensor trained, `aux` included (it has gradients in half the micro-batches).
    assert_trained(stage0, initial_weights(), what + ", stage 0")
    losses0 = [harness.read_json(out / f"{gas}-{dtype}-0.rank{r}.json")["losses"] for r in range(world)]
    assert len(losses0[0]) == gas * cases.ACCUM_STEPS
    for stage in (1, 2, 3):
        assert_bitwise(harness.load_st(out / f"{gas}-{dtype}-{stage}.safetensors"), stage0,
                       f"{what}: stage {stage} vs stage 0")
        losses = [harness.read_json(out / f"{gas}-{dtype}-{stage}.rank{r}.json")["losses"]
                  for r in range(world)]
        assert losses == losses0, f"{what}: stage {stage} losses differ from stage 0's"
