#!/usr/bin/env bash
# Trains a model whose optimizer state is larger than this machine's RAM: ZeRO stage 3, bf16,
# the fp32 master weights and Adam moments (12 bytes per parameter) and the 16-bit parameters on
# NVMe, streamed through a few buffers. Not part of CI (it writes tens of GB).
#
#   scripts/offload-demo.sh [--params N] [--nvme-path DIR] [--steps K] [--world-size W]
#
# --params     parameters to train, rounded to whole layers (default 2.2e9: 26 GB of master
#              weights and moments, more than a 24 GiB machine holds)
# --nvme-path  folder on the disk to swap to (default /var/tmp); it needs about 2 x 14 bytes per
#              parameter free, as every record has two slots (a failed write loses nothing)
# --steps      optimizer steps (default 3)
# RAM: the process holds about 4 bytes per parameter (the engine's fp32 gradient partition)
# besides about 3 GB of buffers (optimizer and parameter swap buffers, gathered layers); measured
# peak RSS 3.38 GiB at 4.7e8 parameters. zero-train's teacher is made anew every step when it
# exceeds 1 GiB, and its model reads and writes the engine's buffers in place, so nothing else
# grows with the model.
# Prints each step's time, the bytes the process read from and wrote to the disk, their GB/s,
# and the peak RSS, from /proc and getrusage (not from the engine's own counters).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
params=2.2e9 nvme=/var/tmp steps=3 world=1
while [ $# -gt 0 ]; do
  case $1 in
    --params) params=$2; shift 2 ;;
    --nvme-path) nvme=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --world-size) world=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "offload-demo: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$build/tools/zero-train" ] || { echo "offload-demo: no $build/tools/zero-train: run scripts/build.sh first" >&2; exit 1; }
[ -d "$nvme" ] && [ -w "$nvme" ] || { echo "offload-demo: --nvme-path $nvme is not a writable folder" >&2; exit 1; }

# Square layers of width H: L layers of H*H + H parameters.
read -r width layers total < <(python3 - "$params" <<'EOF'
import sys
p = float(sys.argv[1])
h = 8192 if p >= 5e8 else 2048
layers = max(2, round(p / (h * h + h)))
print(h, layers, layers * (h * h + h))
EOF
)
need=$(( total * 28 ))           # two slots of 12 (master, moments) + 2 (bf16 params) bytes each
free=$(( $(df --output=avail -B1 "$nvme" | tail -1) ))
ram=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024 ))
gb() { python3 -c "print(f'{$1 / 1e9:.1f}')"; }
echo "offload-demo: $total parameters ($layers layers of ${width}x$width), optimizer state $(gb $(( total * 12 ))) GB, RAM $(gb $ram) GB"
echo "offload-demo: swap files need about $(gb $need) GB in $nvme; $(gb $free) GB free"
if [ "$need" -gt "$free" ]; then
  fits=$(( free / 28 * 9 / 10 ))
  echo "offload-demo: not enough disk: give --nvme-path a folder with $(gb $need) GB free, or --params $fits" >&2
  exit 1
fi

# The estimate above, against what the kernel says is available.
need_ram=$(( total * 4 + 3000000000 ))
avail=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
if [ "$need_ram" -gt "$avail" ]; then
  fits_ram=$(( (avail - 3000000000) / 4 * 9 / 10 ))
  echo "offload-demo: not enough memory: about $(gb $need_ram) GB needed (4 bytes per parameter for the engine's fp32 gradient partition, 3 GB of buffers), $(gb $avail) GB available; try --params $fits_ram" >&2
  exit 1
fi

work=$(mktemp -d "$nvme/offload-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/ds_config.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 2e7,
    "reduce_bucket_size": 5e7,
    "offload_optimizer": {"device": "nvme", "nvme_path": "$work", "buffer_count": 4,
                          "pipeline_read": true, "pipeline_write": true},
    "offload_param": {"device": "nvme", "nvme_path": "$work", "buffer_count": 5,
                      "buffer_size": $(( width * width * 2 )), "max_in_cpu": $(( width * width ))},
    "stage3_max_live_parameters": $(( total + width * width )),
    "stage3_prefetch_bucket_size": $(( width * width * 2 ))
  },
  "aio": {"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 2}
}
EOF
model="mlp:$width$(printf ",$width%.0s" $(seq 1 "$layers"))"
echo "offload-demo: zero-train --model mlp:${width}x$((layers + 1)) --steps $steps --world-size $world (config in $work)"

python3 - "$build/tools/zero-train" "$work/ds_config.json" "$model" "$steps" "$world" <<'EOF'
import json, resource, subprocess, sys, threading, time

exe, config, model, steps, world = sys.argv[1:]
cmd = [exe, "--config", config, "--model", model, "--steps", steps, "--world-size", world,
       "--json", "--seed", "1"]
start = time.monotonic()
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
io = {"read_bytes": 0, "write_bytes": 0}

def sample():
    # The process's storage I/O, sampled until it exits (the last sample before exit counts).
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/io") as f:
                for line in f:
                    k, v = line.split(":")
                    if k in io:
                        io[k] = int(v)
        except OSError:
            pass
        time.sleep(0.2)

t = threading.Thread(target=sample)
t.start()
step_times, summary, io_at_first_step = [], None, None
for line in proc.stdout:
    rec = json.loads(line)
    if "step" in rec:
        step_times.append(rec["step_time_s"])
        if io_at_first_step is None:
            io_at_first_step = dict(io)
        print(f"step {rec['step']}: {rec['step_time_s']:.1f} s (model {rec.get('model_time_s', 0):.1f} s), "
              f"loss {rec['loss']:.6g}, disk read {io['read_bytes'] / 1e9:.1f} GB, "
              f"written {io['write_bytes'] / 1e9:.1f} GB so far", flush=True)
    else:
        summary = rec
rc = proc.wait()
t.join()
wall = time.monotonic() - start
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
if rc != 0:
    sys.exit(f"offload-demo: zero-train exited with {rc}")
moved = io["read_bytes"] + io["write_bytes"]
stepping = sum(step_times)
print(f"offload-demo: {len(step_times)} steps in {stepping:.1f} s (median {sorted(step_times)[len(step_times) // 2]:.1f} s), "
      f"{wall:.1f} s wall with start-up")
print(f"offload-demo: disk read {io['read_bytes'] / 1e9:.1f} GB, written {io['write_bytes'] / 1e9:.1f} GB "
      f"({moved / wall / 1e9:.2f} GB/s over the run)")
mem = summary["memory"][0]
print(f"offload-demo: peak RSS {rss / 2**30:.2f} GiB; ledger peaks: nvme {mem['nvme_peak_bytes'] / 1e9:.1f} GB, "
      f"pinned host {mem['host_pinned_peak_bytes'] / 1e9:.2f} GB, device {mem['device_peak_bytes'] / 1e9:.2f} GB")
print(f"offload-demo: loss {summary['first_loss']:.6g} -> {summary['final_loss']:.6g}")
EOF
