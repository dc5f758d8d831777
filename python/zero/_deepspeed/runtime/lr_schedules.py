"""deepspeed.runtime.lr_schedules: the schedule names a config's "scheduler" block may give
(zero runs each of them; zero/schedule/)."""
VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
