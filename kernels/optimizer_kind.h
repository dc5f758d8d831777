// Which update rule a param group uses. Plain enum, usable from CUDA translation units.
#pragma once

namespace zero::kernels {

// Adam is torch.optim.Adam: weight decay as an L2 term added to the gradient. AdamW decays the
// weights directly. DeepSpeed's "type": "Adam" means AdamW unless "adam_w_mode": false
// (SPEC_DEEPSPEED.md §1.7, §10.1); the config layer makes that choice, kernels take it explicitly.
enum class OptimizerKind { Adam, AdamW, Adagrad, Lion, Sgd };

}  // namespace zero::kernels
