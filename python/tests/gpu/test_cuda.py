"""zero.initialize with a model on a CUDA GPU (issue 31 item 5), in one process: stages 0-3 in
fp32 and bf16 against torch.optim.AdamW on the same GPU and against each other, parameters as
views of the engine's device memory, stage 3 gathering into device memory, gradients taken on a
side stream, a checkpoint saved on the GPU resumed there and on the CPU, and qwZ's quantized
gathers on the GPU against the CPU's. Skipped without a
GPU; scripts/gpu-check.sh runs it on one and counts a skip as a failure. With GPU_CHECK_OUT set
the figures (losses, peak memory next to plain PyTorch's) go to GPU_CHECK_OUT/python-cuda.json."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import cases
import harness
from harness import assert_bitwise, assert_trained

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HERE = Path(__file__).resolve().parent
STAGES = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda")
    env = harness.child_env({"OMP_NUM_THREADS": "4"})
    proc = subprocess.run([sys.executable, str(HERE / "worker_cuda.py"), str(out)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    if proc.returncode != 0 and not list(out.glob("*.error.txt")):
        pytest.fail(f"worker_cuda.py failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}",
                    pytrace=False)
    summary = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    summary["errors"] = {p.name.split(".")[0]: p.read_text()[-2000:]
                         for p in sorted(out.glob("*.error.txt"))}
    # Peak GPU memory per run: the engine's ledger (its own cudaMalloc'd model states, buckets
    # and gathers) beside torch's allocator (activations and gradients), and plain PyTorch's.
    summary["peak_memory_bytes"] = {
        name: {"engine_device_peak": run.get("engine_memory", {}).get("kinds", {})
               .get("device", {}).get("peak"),
               "torch_max_memory_allocated": run.get("torch_peak_bytes")}
        for name, run in summary.items() if name != "errors"}
    target = os.environ.get("GPU_CHECK_OUT")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / "python-cuda.json").write_text(json.dumps(summary, indent=1))
    return out


def require_run(out, name):
    """Fails the calling test with the run's own traceback when the worker's run failed."""
    error = out / f"{name}.error.txt"
    if error.exists():
        pytest.fail(f"run {name} failed in worker_cuda.py:\n{error.read_text()[-4000:]}",
                    pytrace=False)


def master(out, name):
    require_run(out, name)
    return harness.load_st(out / f"{name}.safetensors")


def info(out, name):
    require_run(out, name)
    return json.loads((out / f"{name}.json").read_text())


def assert_within_scale(actual, expected, what, rel=1e-5):
    """Every element within rel x the largest magnitude of its tensor in `expected`."""
    bad = []
    for k in sorted(expected):
        a, e = actual[k].float(), expected[k].float()
        scale = max(e.abs().max().item(), 1e-12)
        diff = (a - e).abs().max().item()
        if diff > rel * scale:
            bad.append(f"{k}: max |diff| {diff:.3g} > {rel} x {scale:.3g}")
    assert not bad, f"{what}:\n  " + "\n  ".join(bad[:8])


def test_fp32_every_stage_matches_adamw_on_the_gpu(out):
    ref = master(out, "reference")
    assert_trained(ref, harness.initial_weights("transformer"), "AdamW on the GPU")
    for stage in STAGES:
        m = master(out, f"{stage}-fp32")
        assert_trained(m, harness.initial_weights("transformer"), f"stage {stage} fp32")
        assert_within_scale(m, ref, f"stage {stage} fp32 vs torch.optim.AdamW")


@pytest.mark.parametrize("dtype", ("fp32", "bf16"))
def test_stages_are_bitwise_equal_on_the_gpu(out, dtype):
    m0 = master(out, f"0-{dtype}")
    assert_trained(m0, harness.initial_weights("transformer"), f"stage 0 {dtype}")
    for stage in (1, 2, 3):
        assert_bitwise(master(out, f"{stage}-{dtype}"), m0, f"{dtype}: stage {stage} vs 0")
        assert info(out, f"{stage}-{dtype}")["losses"] == info(out, f"0-{dtype}")["losses"]


def test_parameters_are_views_of_device_memory_and_stage3_gathers_there(out):
    for dtype in ("fp32", "bf16"):
        for stage in (0, 1, 2):
            i = info(out, f"{stage}-{dtype}")
            assert i["device"].startswith("cuda"), i["device"]
            assert i["not_views"] == [], f"stage {stage} {dtype}: not views: {i['not_views']}"
            assert i["module_is_master"], f"stage {stage} {dtype}: module differs from master"
        gathered = info(out, f"3-{dtype}")["gathered"]
        assert gathered and all(g[0].startswith("cuda") and g[2] for g in gathered), gathered
        assert [tuple(g[1]) for g in gathered] == [(4 * cases.D_MODEL, cases.D_MODEL)]
        device_peak = info(out, f"3-{dtype}")["engine_memory"]
        assert device_peak, "the engine reported no memory"


def test_gradients_from_a_side_stream_are_taken_in_order(out):
    assert_bitwise(master(out, "stream-2-fp32"), master(out, "2-fp32"),
                   "stage 2 fp32 on a side stream vs the default stream")


def test_stage3_gathers_waited_for_by_a_side_stream_train_as_on_the_default_one(out):
    # The forward's gathers are waited for on the GPU by torch's current stream
    # (zero_engine_gather_on_stream): a side stream must see each all-gather done, and the engine's
    # next collectives must wait for that stream's reads of released units.
    assert_bitwise(master(out, "stream-3-fp32"), master(out, "3-fp32"),
                   "stage 3 fp32 on a side stream vs the default stream")


def test_a_checkpoint_saved_on_the_gpu_resumes_there_and_on_the_cpu(out):
    straight = master(out, "1-fp32")
    assert_bitwise(master(out, "resume-gpu-1-fp32"), straight, "resumed on the GPU")
    assert info(out, "resume-gpu-1-fp32")["losses"] == info(out, "1-fp32")["losses"][5:]
    resumed_cpu = master(out, "resume-cpu-1-fp32")
    assert info(out, "resume-cpu-1-fp32")["device"] == "cpu"
    assert_within_scale(resumed_cpu, straight, "resumed on the CPU vs the GPU run", rel=1e-5)


def test_qwz_gathers_quantized_on_the_gpu_train_as_on_the_cpu(out):
    # zero_quantized_weights at stage 3: each gather quantizes and dequantizes with the CUDA
    # quantizer, whose bytes are the CPU's; the model's own arithmetic differs a little between
    # the devices, so the two runs agree to training noise, and neither is plain stage 3's.
    on_gpu, on_cpu = master(out, "qwz-cuda-3-fp32"), master(out, "qwz-cpu-3-fp32")
    assert_trained(on_gpu, harness.initial_weights("transformer"), "qwZ on the GPU")
    assert_within_scale(on_gpu, on_cpu, "qwZ on the GPU vs on the CPU", rel=1e-3)
    plain = master(out, "3-fp32")
    assert any(not torch.equal(on_gpu[k], plain[k]) for k in plain), "qwZ changed nothing"
