"""deepspeed.utils: the logger DeepSpeed's callers write to."""
import logging

logger = logging.getLogger("DeepSpeed")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
