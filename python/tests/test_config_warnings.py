"""Warnings the config layer finds reach Python users: zero.initialize warns (ZeroConfigWarning)
about an unknown top-level key with its did-you-mean, once per process, as `zero-config check`
prints it. Also: Accelerate's steps_per_print=inf is taken, another infinite value is refused by
name. One rank, in this process."""
import math
import warnings

import pytest
import torch

import zero


def build(config):
    model = torch.nn.Linear(4, 2)
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    engine.close()


def base():
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": 1}}


def test_an_unknown_key_is_a_warning_with_its_did_you_mean_once_per_process():
    config = dict(base(), zero_optimisation={"stage": 2})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(config)
        build(config)
    ours = [w for w in caught if issubclass(w.category, zero.ZeroConfigWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert "zero_optimisation" in text and "zero_optimization" in text, text
    assert "unknown top-level key" in text
    with warnings.catch_warnings(record=True) as caught:  # a clean config: nothing
        warnings.simplefilter("always")
        build(base())
    assert not [w for w in caught if issubclass(w.category, zero.ZeroConfigWarning)]


def test_accelerates_infinite_steps_per_print_is_taken_and_other_infinities_refused():
    build(dict(base(), steps_per_print=float("inf")))
    bad = base()
    bad["optimizer"]["params"]["lr"] = math.nan
    with pytest.raises(zero.ZeroError, match=r"optimizer\.params\.lr' is nan"):
        build(bad)


def test_zeropp_keys_below_stage_3_and_qgz_on_one_node_are_warnings():
    below = dict(base(), zero_optimization={"stage": 2, "mics_shard_size": 2,
                                            "zero_quantized_weights": True})
    qgz = dict(base(), zero_optimization={"stage": 3, "zero_quantized_gradients": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(below)
        build(qgz)
    texts = [str(w.message) for w in caught if issubclass(w.category, zero.ZeroConfigWarning)]
    for key in ("mics_shard_size", "zero_quantized_weights"):
        assert any(key in t and "ignored below ZeRO stage 3 (stage is 2)" in t for t in texts), texts
    assert any("zero_quantized_gradients: the ranks are on one node" in t and "reduced exactly" in t
               for t in texts), texts
