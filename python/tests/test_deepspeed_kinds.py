"""Every kind of checkpoint DeepSpeed writes (tests/data/deepspeed_checkpoints, made by DeepSpeed
0.19.8: stage 0 fp32 and bf16, BF16_Optimizer, universal, ZeRO 2/3 with frozen parameters) reads
through zero.utils without a pickle, and loads into zero.initialize's engine at stage 0 and 3."""
import math
from pathlib import Path

import pytest
import safetensors.torch
import torch

import harness

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "data" / "deepspeed_checkpoints"
KINDS = ("zero0_fp32", "zero0_bf16", "bf16_zero1", "universal", "zero2_frozen_bf16",
         "zero3_frozen_bf16")


@pytest.mark.parametrize("kind", KINDS)
def test_get_fp32_state_dict_gives_what_deepspeed_stores(kind):
    from zero.utils import get_fp32_state_dict_from_zero_checkpoint

    got = get_fp32_state_dict_from_zero_checkpoint(FIXTURES / kind)
    want = safetensors.torch.load_file(str(FIXTURES / kind / "expected_fp32.safetensors"))
    assert sorted(got) == sorted(want), kind
    for name, w in want.items():
        # fp32, but frozen parameters in the dtype they were saved in, as DeepSpeed returns them
        assert got[name].dtype == w.dtype, f"{kind}: {name} is {got[name].dtype}, not {w.dtype}"
        assert torch.equal(got[name], w), f"{kind}: {name} differs"
    assert sum(int((w != 0).sum()) for w in want.values()) > 1500, "vacuous comparison"


@pytest.mark.parametrize("stage", (0, 3))
@pytest.mark.parametrize("kind", ("zero0_bf16", "universal", "bf16_zero1"))
def test_load_checkpoint_imports_it_and_training_goes_on(tmp_path, kind, stage):
    from zero.utils import get_fp32_state_dict_from_zero_checkpoint

    r = harness.one_process("worker_ds_import.py", [FIXTURES / kind, stage, tmp_path], 120)
    assert r.returncode == 0, f"{kind} into stage {stage}:\n{r.out}"
    result = harness.read_json(tmp_path / "result.json")
    assert result["global_steps_loaded"] == 5 and result["global_steps"] == 7, result
    assert all(math.isfinite(x) for x in result["losses"]), result
    # What the engine holds after the load (saved by it, read back) is what DeepSpeed stored.
    held = get_fp32_state_dict_from_zero_checkpoint(tmp_path, tag="loaded")
    want = safetensors.torch.load_file(str(FIXTURES / kind / "expected_fp32.safetensors"))
    assert sorted(held) == sorted(want)
    for name, w in want.items():
        assert torch.equal(held[name], w.float()), f"{kind} into stage {stage}: {name}"
