"""The PyTorch-on-CUDA checks' one process (run by test_cuda.py): trains cases.TinyLM on GPU 0
with zero at stages 0-3 in fp32 and bf16, and with torch.optim.AdamW, and writes to OUT:
  S-D.safetensors       fp32 master weights after STEPS steps (engine.gather_master)
  S-D.json              losses, the engine's device peak, torch's peak, the view checks
  stream-2-fp32.*       stage 2 fp32 with forward/backward on a side stream
  stream-3-fp32.*       stage 3 fp32 the same: its gathers waited for by that stream, on the GPU
  resume-gpu-1-fp32.*   stage 1 fp32 resumed on the GPU from the checkpoint saved at MID
  resume-cpu-1-fp32.*   the same checkpoint resumed with the model on the CPU
  reference.*           torch.optim.AdamW (foreach) on the GPU, same model and data
Deterministic algorithms are on, so runs that should agree bitwise can. A run that fails leaves
NAME.error.txt (its traceback) and the others still run; the exit status is then 1.

  worker_cuda.py OUT
"""
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import cases  # noqa: E402

STEPS, MID = 10, 5
MODEL = "transformer"
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def write(out, name, master, info):
    save_file({k: v.detach().float().cpu().clone().contiguous() for k, v in master.items()},
              str(out / f"{name}.safetensors"))
    (out / f"{name}.json").write_text(json.dumps(info))


def view_checks(zero, engine):
    """Stages 0-2: every parameter is CUDA memory at the engine's address for it."""
    import ctypes
    from zero._lib import call

    bad = []
    for r in engine._registered:
        ptr, nbytes = ctypes.c_void_p(), ctypes.c_size_t()
        call("zero_engine_param", engine._handle, r.index, ctypes.byref(ptr), ctypes.byref(nbytes))
        if not r.param.is_cuda or r.param.data_ptr() != ptr.value:
            bad.append(r.name)
    return bad


def train_zero(zero, out, name, stage, dtype, device="cuda", stream=None, save=None, load=None,
               zero_keys=None):
    torch.manual_seed(cases.MODEL_SEED)
    model = cases.build(MODEL).to(device)
    cfg = cases.config(stage, dtype, 1)
    cfg["zero_optimization"].update(zero_keys or {})
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    info = {"stage": stage, "dtype": dtype, "device": str(engine.device)}
    if device == "cuda" and stage < 3:
        info["not_views"] = view_checks(zero, engine)
    gathered_on = set()
    if stage == 3:  # what a module sees while it runs: gathered device memory, whole
        lin = engine.module.blocks[0].fc
        lin.register_forward_pre_hook(
            lambda m, _: gathered_on.add((str(m.weight.device), tuple(m.weight.shape),
                                          m.weight.stride() != (0, 0))))
    start = 0
    if load is not None:
        _, client = engine.load_checkpoint(load, tag="mid")
        start = client["step"]
    torch.cuda.reset_peak_memory_stats()
    losses = []
    ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(
        torch.cuda.current_stream())
    with ctx:
        for step in range(start, STEPS):
            x, y = cases.global_batch(MODEL, step)
            x, y = x.to(device), y.to(device)
            loss = cases.loss_fn(MODEL, engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            if save is not None and step + 1 == MID:
                engine.save_checkpoint(save, tag="mid", client_state={"step": MID})
    if stream is not None:
        stream.synchronize()
    memory = engine.memory()
    info.update(losses=losses, torch_peak_bytes=torch.cuda.max_memory_allocated(),
                engine_memory=memory, gathered=sorted(map(list, gathered_on)))
    # Every name of the state dict, tied ones too (lm_head.weight is embed.weight).
    master = {n: engine.gather_master(n)
              for n, _ in engine.module.named_parameters(remove_duplicate=False)}
    module_matches = all(
        torch.equal(p.detach().float().cpu(), master[n].to(p.dtype).float())
        for n, p in engine.module.named_parameters()) if stage < 3 else None
    info["module_is_master"] = module_matches
    write(out, name, master, info)
    engine.close()


def train_reference(out):
    torch.manual_seed(cases.MODEL_SEED)
    model = cases.build(MODEL).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=cases.LR, betas=cases.BETAS, eps=cases.EPS,
                            weight_decay=cases.WEIGHT_DECAY, foreach=True)
    torch.cuda.reset_peak_memory_stats()
    losses = []
    for step in range(STEPS):
        x, y = cases.global_batch(MODEL, step)
        opt.zero_grad()
        loss = cases.loss_fn(MODEL, model(x.cuda()), y.cuda())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cases.GRADIENT_CLIPPING)
        opt.step()
        losses.append(loss.item())
    write(out, "reference", dict(model.named_parameters(remove_duplicate=False)),
          {"losses": losses, "torch_peak_bytes": torch.cuda.max_memory_allocated()})


def main():
    out = Path(sys.argv[1])
    # warn_only: an op without a deterministic kernel warns rather than stops the run; the
    # bitwise checks then show whether it mattered.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_num_threads(4)
    import zero

    runs = [("reference", lambda: train_reference(out))]
    for dtype in ("fp32", "bf16"):
        for stage in (0, 1, 2, 3):
            save = str(out / "ckpt") if (stage, dtype) == (1, "fp32") else None
            runs.append((f"{stage}-{dtype}", lambda n=f"{stage}-{dtype}", s=stage, d=dtype, c=save:
                         train_zero(zero, out, n, s, d, save=c)))
    runs += [("stream-2-fp32", lambda: train_zero(zero, out, "stream-2-fp32", 2, "fp32",
                                                  stream=torch.cuda.Stream())),
             ("stream-3-fp32", lambda: train_zero(zero, out, "stream-3-fp32", 3, "fp32",
                                                  stream=torch.cuda.Stream())),
             ("resume-gpu-1-fp32", lambda: train_zero(zero, out, "resume-gpu-1-fp32", 1, "fp32",
                                                      load=str(out / "ckpt"))),
             ("resume-cpu-1-fp32", lambda: train_zero(zero, out, "resume-cpu-1-fp32", 1, "fp32",
                                                      device="cpu", load=str(out / "ckpt")))]
    # qwZ: every unit (none persistent) gathered through the device's quantizer.
    qwz = {"zero_quantized_weights": True, "stage3_param_persistence_threshold": 0}
    runs += [(f"qwz-{where}-3-fp32",
              lambda w=where: train_zero(zero, out, f"qwz-{w}-3-fp32", 3, "fp32", device=w,
                                         zero_keys=qwz))
             for where in ("cuda", "cpu")]
    # Every run is tried, so one failure does not hide what the others would show.
    failed = 0
    for name, run in runs:
        try:
            run()
        except Exception:  # noqa: BLE001 - written for the test to report, then the next run
            failed += 1
            (out / f"{name}.error.txt").write_text(traceback.format_exc())
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
