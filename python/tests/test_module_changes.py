"""After zero.initialize the module's parameters are the engine's: one added, removed or replaced,
or a .data reassigned, is a ZeroError naming it at the next forward; a change that leaves the
parameters alone (a module without parameters added) is not. The check runs once a micro-step (in
forward, or in step() when the module was called directly), so it compares the module tree by
identity and walks named_parameters() only when the tree changed. One rank, in this process."""
import pytest
import torch

import cases
import zero
from zero import ZeroError


def engine_for(model):
    cfg = {"train_micro_batch_size_per_gpu": cases.GLOBAL_BATCH, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": cases.LR}},
           "zero_optimization": {"stage": 1}}
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def one_step(engine, step=0):
    x, y = cases.global_batch("mlp", step)
    engine.backward(cases.loss_fn("mlp", engine(x), y))
    engine.step()


def replace(model):
    model[0].weight = torch.nn.Parameter(model[0].weight.detach().clone())


def add(model):
    model[2].extra = torch.nn.Parameter(torch.zeros(3))


def remove(model):
    del model[3].bias
    model[3].bias = None


def reassign(model):
    model[3].weight.data = model[3].weight.data.clone()


@pytest.mark.parametrize("change, name, words", [
    (replace, "0.weight", "was replaced"),
    (add, "2.extra", "was added"),
    (remove, "3.bias", "was removed"),
    (reassign, "3.weight", "reassigned"),
])
def test_a_changed_parameter_is_named_at_the_next_forward(change, name, words):
    model = cases.build("mlp")
    engine = engine_for(model)
    one_step(engine)
    change(model)
    with pytest.raises(ZeroError, match=rf"'{name}'.*{words}|{words}.*'{name}'") as e:
        one_step(engine, 1)
    assert name in str(e.value) and words in str(e.value)
    engine.close()


def test_a_module_without_parameters_added_changes_nothing():
    model = cases.build("mlp")
    engine = engine_for(model)
    one_step(engine)
    model.add_module("tail", torch.nn.Identity())  # the tree changed, its parameters did not
    for step in range(1, 3):
        one_step(engine, step)
    # ... and a parameter replaced after that is still found (the tree was taken anew).
    replace(model)
    with pytest.raises(ZeroError, match="'0.weight' was replaced"):
        one_step(engine, 3)
    engine.close()


def test_a_step_after_the_module_was_called_directly_checks_the_parameters():
    """No forward() through the engine in the micro-step: step() checks, before the optimizer."""
    model = cases.build("mlp")
    engine = engine_for(model)
    one_step(engine)
    before = engine.global_steps
    x, y = cases.global_batch("mlp", 1)
    engine.backward(cases.loss_fn("mlp", engine.module(x), y))
    reassign(model)
    with pytest.raises(ZeroError, match="'3.weight'.*reassigned"):
        engine.step()
    assert engine.global_steps == before
    engine.close()


def test_a_change_after_forward_is_named_at_the_next_forward():
    """forward() checked this micro-step, so step() does not again: the change is found next."""
    model = cases.build("mlp")
    engine = engine_for(model)
    x, y = cases.global_batch("mlp", 0)
    engine.backward(cases.loss_fn("mlp", engine(x), y))
    reassign(model)
    engine.step()
    with pytest.raises(ZeroError, match="'3.weight'.*reassigned"):
        one_step(engine, 1)
    engine.close()
