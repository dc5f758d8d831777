"""A ds_config as zero.initialize takes it (a path or a dict) and its warnings' category."""
import json
import math
import os

from ._lib import ZeroError


def without_infinite_steps_per_print(config):
    """Accelerate's DeepSpeed plugin sets steps_per_print to float("inf") ("never print"), which
    JSON cannot hold: the key goes, as zero prints nothing per step anyway."""
    value = config.get("steps_per_print")
    if isinstance(value, float) and math.isinf(value) and value > 0:
        config = {k: v for k, v in config.items() if k != "steps_per_print"}
    return config


def check_finite(value, path):
    """Raises ZeroError naming the first key whose value is a NaN or infinite float."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ZeroError(f"config key '{path}' is {value}; JSON (and DeepSpeed's config) holds "
                        "finite numbers only: give a number")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{path}[{i}]")


def load_config(config):
    """(JSON text, dict) of `config`: a path to a ds_config file or a dict."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise ZeroError(f"config path '{path}' does not exist (or is not a file): pass the "
                            "path of a ds_config.json or a dict")
        with open(path) as f:
            text = f.read()
        try:
            document = json.loads(text)
        except json.JSONDecodeError as e:
            raise ZeroError(f"config '{path}' is not valid JSON: {e}") from None
        return text, document
    if isinstance(config, dict):
        config = without_infinite_steps_per_print(config)
        check_finite(config, "")
        try:
            return json.dumps(config), config
        except (TypeError, ValueError) as e:
            raise ZeroError(f"config dict cannot be written as JSON: {e}") from None
    raise ZeroError(f"config is a {type(config).__name__}; expected a path or a dict")


class ZeroConfigWarning(UserWarning):
    """A ds_config warning from zero's config layer (what `zero-config check` prints)."""
