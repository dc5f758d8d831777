#!/usr/bin/env python3
"""Makes real DeepSpeed checkpoints of every kind zero imports, with DeepSpeed itself.

Usage (a Python environment with torch and deepspeed; DeepSpeed runs on its CPU accelerator
with the gloo backend, ranks as processes on this host):

    python scripts/make_ds_checkpoints.py OUT_DIR [--kinds K,K,...] [--world 2] [--big-params N]

Each kind becomes OUT_DIR/<kind>/, a save directory as DeepSpeed writes it (`latest` names the
tag `step5`), plus `expected_fp32.safetensors`: the fp32 values DeepSpeed stores for every
parameter, computed from the checkpoint's own files by DeepSpeed's own code where it has any,
and `expected_states.safetensors`: every trainable parameter's Adam moments ("<name>.exp_avg",
"<name>.exp_avg_sq") as the checkpoint stores them, and "step":

    zero0_fp32        no zero_optimization: the weights and torch AdamW's state in
                      mp_rank_00_model_states.pt (`module`, `optimizer`)
    zero0_bf16        the same with bf16: FP16_UnfusedOptimizer keeps the fp32 master copies in
                      `optimizer.fp32_groups`; `module` holds the bf16 values
    bf16_zero1        bf16, stage 1, fp32 gradient accumulation: BF16_Optimizer, files
                      bf16_zero_pp_rank_<r>_mp_rank_00_optim_states.pt (DeepSpeed's zero_to_fp32
                      refuses it; the expected values come from its ds_to_universal)
    universal         ds_to_universal's output for a ZeRO-2 bf16 checkpoint (zero/<name>/fp32.pt,
                      exp_avg.pt, exp_avg_sq.pt, step.pt; `latest_universal`)
    zero2_frozen_bf16 ZeRO-2 bf16 with a frozen layer: frozen_param_fragments hold it in bf16
    zero3_frozen_bf16 the same at stage 3 (each rank holds its fragment)
    big               (only with --big-params N) ZeRO-2 fp32 of about N parameters, for
                      `zero-bench checkpoint --deepspeed`; no expected file

The model is small and unevenly sized (so partitions carry padding); 5 AdamW steps (torch's
AdamW: DeepSpeed's fused CPU kernels need a compiler at run time) on data fixed by seed.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

KINDS = ("zero0_fp32", "zero0_bf16", "bf16_zero1", "universal", "zero2_frozen_bf16",
         "zero3_frozen_bf16")
STEPS = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ds_config(kind, world):
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 4 * world,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.99], "eps": 1e-6,
                                                   "weight_decay": 0.01, "torch_adam": True}},
        "gradient_clipping": 0.0,
        "steps_per_print": 1000,
    }
    if kind in ("zero0_bf16", "bf16_zero1", "universal", "zero2_frozen_bf16",
                "zero3_frozen_bf16"):
        config["bf16"] = {"enabled": True}
    if kind == "bf16_zero1":
        config["zero_optimization"] = {"stage": 1}
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    elif kind in ("universal", "zero2_frozen_bf16", "big"):
        config["zero_optimization"] = {"stage": 2}
    elif kind == "zero3_frozen_bf16":
        config["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
    return config


def model(kind, big_params):
    import torch
    torch.manual_seed(1234)
    if kind == "big":
        # Square layers of width w: w*w + w parameters each.
        w = 2048
        layers = max(1, round(big_params / (w * w + w)))
        mods = []
        for i in range(layers):
            mods += [torch.nn.Linear(w, w), torch.nn.ReLU()]
        return torch.nn.Sequential(*mods[:-1]), w, w
    m = torch.nn.Sequential(torch.nn.Linear(13, 40), torch.nn.ReLU(), torch.nn.LayerNorm(40),
                            torch.nn.Linear(40, 24), torch.nn.ReLU(), torch.nn.Linear(24, 5))
    if kind.endswith("frozen_bf16"):
        for p in m[2].parameters():  # the LayerNorm: trained nowhere, saved as it is
            p.requires_grad_(False)
        with torch.no_grad():
            m[2].weight.uniform_(0.5, 1.5)
            m[2].bias.uniform_(-0.5, 0.5)
    return m, 13, 5


def worker(kind, out, world, big_params):
    """One rank (runs in its own process): train STEPS steps and save."""
    import torch
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    m, d_in, d_out = model(kind, big_params)
    engine, _, _, _ = deepspeed.initialize(model=m, model_parameters=[p for p in m.parameters()
                                                                      if p.requires_grad],
                                           config=ds_config(kind, world))
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    g = torch.Generator().manual_seed(99)
    steps = 1 if kind == "big" else STEPS
    for step in range(steps):
        x = torch.randn(4 * world, d_in, generator=g)[4 * rank:4 * (rank + 1)]
        y = torch.randn(4 * world, d_out, generator=g)[4 * rank:4 * (rank + 1)]
        loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(out, tag=f"step{steps}")


def run_ranks(kind, out, world, big_params):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    procs = []
    for r in range(world):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", kind, out,
                                       str(world), str(big_params)], env=e))
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"{kind}: a rank failed (exit codes {codes})")


def save_expected(state, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in state.items()}, path)


def expected_zero0(save_dir):
    """Stage 0: the fp32 master copies where the optimizer wrapper keeps them, else `module`."""
    import torch
    tag = open(os.path.join(save_dir, "latest")).read().strip()
    sd = torch.load(os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"),
                    map_location="cpu", weights_only=False)
    module, opt = sd["module"], sd["optimizer"]
    if "fp32_groups" in opt:
        names = [n for n in sd["param_names"]] if "param_names" in sd else None
        flat = [t for group in opt["fp32_groups"] for t in group]
        params = [n for n, v in module.items() if n not in sd.get("buffer_names", [])]
        names = names or params
        assert len(flat) == len(names), (len(flat), names)
        out = {n: t.float().clone() for n, t in zip(names, flat)}
        for n in sd.get("buffer_names", []):
            out[n] = module[n].float()
        return out
    return {n: t.float().clone() for n, t in module.items()}


def zero0_states(save_dir):
    """Stage 0: torch's optimizer state of every trainable parameter, by the module's names."""
    import torch
    tag = open(os.path.join(save_dir, "latest")).read().strip()
    sd = torch.load(os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"),
                    map_location="cpu", weights_only=False)
    opt = sd["optimizer"]
    inner = opt.get("optimizer_state_dict", opt)
    names = [n for n in sd["module"] if n not in sd.get("buffer_names", [])]
    ids = [i for g in inner["param_groups"] for i in g["params"]]
    assert len(ids) == len(names), "the script's stage-0 models train every parameter"
    out = {}
    for name, i in zip(names, ids):
        for k in ("exp_avg", "exp_avg_sq"):
            out[f"{name}.{k}"] = inner["state"][i][k].float().clone()
        out["step"] = torch.tensor([float(inner["state"][i]["step"])])
    return out


def expected_universal(universal_dir, what="fp32"):
    """What ds_to_universal stored: zero/<name>/<what>.pt's "param" for every parameter;
    with what="states", the moments and the step."""
    import torch
    tag = open(os.path.join(universal_dir, "latest_universal")).read().strip()
    zdir = os.path.join(universal_dir, tag, "zero")
    out = {}
    for name in sorted(os.listdir(zdir)):
        def load(k):
            x = torch.load(os.path.join(zdir, name, k + ".pt"), map_location="cpu",
                           weights_only=False)
            # {"param": tensor, ...merge metadata}; stage-3 sources save the tensor alone
            return x["param"] if isinstance(x, dict) else x
        if not os.path.isfile(os.path.join(zdir, name, "fp32.pt")):
            continue
        if what == "fp32":
            out[name] = load("fp32").float()
        elif os.path.isfile(os.path.join(zdir, name, "exp_avg.pt")):  # frozen ones have none
            for k in ("exp_avg", "exp_avg_sq"):
                out[f"{name}.{k}"] = load(k).float()
            if os.path.isfile(os.path.join(zdir, name, "step.pt")):  # stage-3 sources: none
                out["step"] = torch.tensor([float(load("step"))])
    return out


def saved_step(save_dir):
    """The torch optimizer's step in rank 0's optimizer states (stage 3 nests it deeper)."""
    import glob
    import torch
    tag = open(os.path.join(save_dir, "latest")).read().strip()
    f = sorted(glob.glob(os.path.join(save_dir, tag, "*zero_pp_rank_0_*optim_states.pt")))[0]
    osd = torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    inner = osd.get("base_optimizer_state") or osd["optimizer_state_dict"]
    return torch.tensor([float(inner["state"][0]["step"])])


def to_universal(src_dir, out_dir):
    tag = open(os.path.join(src_dir, "latest")).read().strip()
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                    "--input_folder", os.path.join(src_dir, tag),
                    "--output_folder", os.path.join(out_dir, tag + "_universal"),
                    "--num_extract_workers", "1", "--num_merge_workers", "1",
                    "--inject_missing_state"], check=True,
                   env=dict(os.environ, DS_ACCELERATOR="cpu"))
    with open(os.path.join(out_dir, "latest_universal"), "w") as f:
        f.write(tag + "_universal")


def make(kind, out_root, world, big_params):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    out = os.path.join(out_root, kind)
    if os.path.exists(out):
        shutil.rmtree(out)
    if kind == "universal":
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "zero2_bf16")
            run_ranks("universal", src, world, big_params)
            to_universal(src, out)
        save_expected(expected_universal(out), os.path.join(out, "expected_fp32.safetensors"))
        save_expected(expected_universal(out, "states"),
                      os.path.join(out, "expected_states.safetensors"))
        return
    run_ranks(kind, out, world, big_params)
    for f in ("zero_to_fp32.py", "zero_to_torch.py"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    if kind == "big":
        return
    if kind.startswith("zero0"):
        expected = expected_zero0(out)
        states = zero0_states(out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            # The moments as DeepSpeed's ds_to_universal cuts them out of the partitions.
            to_universal(out, tmp)
            states = expected_universal(tmp, "states")
            states.setdefault("step", saved_step(out))  # ds_to_universal: none from stage 3
            if kind == "bf16_zero1":  # DeepSpeed's zero_to_fp32 refuses BF16_Optimizer files
                expected = expected_universal(tmp)
            else:  # DeepSpeed's own zero_to_fp32: frozen parameters keep their saved dtype
                expected = get_fp32_state_dict_from_zero_checkpoint(out)
    save_expected(expected, os.path.join(out, "expected_fp32.safetensors"))
    save_expected(states, os.path.join(out, "expected_states.safetensors"))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        kind, out, world, big = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        worker(kind, out, world, big)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--big-params", type=int, default=0,
                    help="also make OUT_DIR/big: ZeRO-2 fp32, about this many parameters")
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS and k != "big":
            ap.error(f"--kinds: unknown kind {k!r}; the kinds are {', '.join(KINDS)}, big")
    if a.big_params and "big" not in kinds:
        kinds.append("big")
    for k in kinds:
        print(f"== {k}", flush=True)
        make(k, a.out_dir, a.world, a.big_params)
    print(json.dumps({"made": kinds, "dir": a.out_dir}))


if __name__ == "__main__":
    main()
