"""The lr of a step taken during backward (a window's last micro-step steps its units as both
processes' gradients of them complete): the engine takes the lr at backward(), so an lr written
before backward (a client scheduler stepped after step(), a loop that sets it first) trains
bitwise as the step after backward does, and an lr written between backward() and step() turns
the step in backward off for good, so that every step takes the lr written before it, as
DeepSpeed's does: at once where it is written so from the first step, with a warning and from the
next step on where a step had begun in backward already. Two processes, cases' transformer."""
import pytest

import harness
from harness import assert_bitwise, assert_trained

import worker_lr_in_backward as w

MODES = ("scheduler", "before", "between", "between_once", "after_once")


@pytest.fixture(scope="module")
def lr_runs(tmp_path_factory):
    """{(mode, variant): (rank 0's figures, masters)} for variant "during" (the default) and
    "after" (ZERO_STEP_IN_BACKWARD=0)."""
    out = {}
    for variant, env in (("during", None), ("after", {"ZERO_STEP_IN_BACKWARD": "0"})):
        for mode in MODES:
            d = tmp_path_factory.mktemp(f"{mode}-{variant}")
            launch = harness.torchrun(2, "worker_lr_in_backward.py", ["--out", d, "--mode", mode],
                                      600, d / "log.txt", env=env)
            assert launch.returncode == 0, f"{mode}, {variant}: exit {launch.returncode}\n{launch.tail()}"
            out[mode, variant] = (harness.read_json(d / f"{mode}.rank0.json"),
                                  harness.load_st(d / f"{mode}.safetensors"))
    return out


@pytest.mark.parametrize("mode", ("scheduler", "before"))
def test_an_lr_written_before_backward_steps_during_it_with_the_bits_of_after(lr_runs, mode):
    during, masters = lr_runs[mode, "during"]
    after, reference = lr_runs[mode, "after"]
    assert during["stepped"][0] == 0 < during["stepped"][1] < during["stepped"][-1], during["stepped"]
    assert after["stepped"][-1] == 0
    assert during["lrs"] == after["lrs"] and len(set(during["lrs"])) > 2, during["lrs"]
    assert during["losses"] == after["losses"]
    assert during["warnings"] == [] == after["warnings"]
    initial = harness.initial_weights("transformer")  # the tied head's name too: the masters' keys
    assert_trained(reference, {k: initial[k] for k in reference}, f"{mode}, after backward")
    assert_bitwise(masters, reference, f"{mode}: during vs after backward")
    # The scheduler and the loop write the same lrs: the same step.
    assert_bitwise(masters, lr_runs["before" if mode == "scheduler" else "scheduler", "after"][1],
                   "scheduler vs lr written before each forward")


def test_an_lr_written_between_backward_and_step_from_the_start_turns_it_off_at_once(lr_runs):
    during, masters = lr_runs["between", "during"]
    after, reference = lr_runs["between", "after"]
    assert during["stepped"][-1] == 0, during["stepped"]
    assert during["warnings"] == []
    assert during["lrs"] == after["lrs"] == lr_runs["before", "after"][0]["lrs"]
    assert_bitwise(masters, reference, "between: during vs after backward")
    assert_bitwise(masters, lr_runs["before", "after"][1], "between vs before, after backward")


def test_an_lr_written_between_once_a_step_began_applies_next_with_a_warning(lr_runs):
    during, masters = lr_runs["between_once", "during"]
    once = w.ONCE
    # Steps in backward up to and with step ONCE, none after it.
    assert 0 < during["stepped"][once - 1] < during["stepped"][once] == during["stepped"][-1], \
        during["stepped"]
    assert len(during["warnings"]) == 1 and "applies from the" in during["warnings"][0], during["warnings"]
    # Step ONCE keeps the lr it began with; the written one is the next step's, as if written
    # after step ONCE's step().
    moved, moved_masters = lr_runs["after_once", "during"]
    assert during["lrs"] == moved["lrs"] and during["lrs"][once] != during["lrs"][once + 1]
    assert_bitwise(masters, moved_masters, "written between once vs written after once")
    # With the step in backward off, the written lr is that step's own.
    after, _ = lr_runs["between_once", "after"]
    assert after["lrs"][once] == during["lrs"][once + 1]
    assert after["warnings"] == []
