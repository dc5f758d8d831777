"""deepspeed.launcher.runner: the name of the file of environment variables DeepSpeed's launcher
exports to every node (accelerate reads the constant)."""
import os

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
