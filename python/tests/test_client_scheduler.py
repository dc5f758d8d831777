"""A client LR scheduler on zero (issue 32: the Trainer builds its own schedule): the lr a torch
scheduler writes into an optimizer's param groups is the lr of the next optimizer step, at every
stage, as with torch.optim.AdamW alone. One rank, in this process."""
import pytest
import torch

import cases
import zero
from harness import assert_bitwise, assert_close, assert_trained, initial_weights

STEPS = 8


def warmup_then_decay(step):
    return min(1.0, (step + 1) / 3) * (0.8 ** max(0, step - 3))


def config(stage, with_scheduler_block=False):
    cfg = {"train_micro_batch_size_per_gpu": cases.GLOBAL_BATCH, "gradient_accumulation_steps": 1,
           "gradient_clipping": cases.GRADIENT_CLIPPING, "zero_optimization": {"stage": stage}}
    if with_scheduler_block:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 3}}
    return cfg


def client_optimizer(model):
    groups = [{"params": [p for n, p in model.named_parameters() if n.endswith("bias")],
               "weight_decay": 0.0},
              {"params": [p for n, p in model.named_parameters() if not n.endswith("bias")]}]
    return torch.optim.AdamW(groups, lr=cases.LR, betas=cases.BETAS, eps=cases.EPS,
                             weight_decay=cases.WEIGHT_DECAY)


def warmup_hold_decay(step):
    """Steps where the lr stays put: nothing must take the other optimizer's lr for a change."""
    return (0.5, 1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.25)[step]


def reference(schedule=warmup_then_decay):
    model = cases.build("mlp")
    opt = client_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for step in range(STEPS):
        x, y = cases.global_batch("mlp", step)
        opt.zero_grad()
        cases.loss_fn("mlp", model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cases.GRADIENT_CLIPPING)
        opt.step()
        sched.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(stage, after_initialize=False, schedule=warmup_then_decay, save_to=None):
    """zero with the schedule passed to initialize, or built on engine.optimizer afterwards and
    stepped by the caller (the Trainer's way); save_to: a checkpoint after step 3 on the way."""
    model = cases.build("mlp")
    opt = client_optimizer(model)
    if after_initialize:
        engine, optimizer, _, _ = zero.initialize(model=model, optimizer=opt, config=config(stage))
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    else:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        engine, _, _, returned = zero.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                                 config=config(stage))
        assert returned is sched
    lrs = []
    for step in range(STEPS):
        x, y = cases.global_batch("mlp", step)
        engine.backward(cases.loss_fn("mlp", engine(x), y))
        engine.step()
        lrs.append(engine.get_lr())
        if after_initialize:
            sched.step()
        if save_to is not None and step == 3:
            engine.save_checkpoint(save_to)
    out = {n: engine.gather_master(n) for n in cases.build("mlp").state_dict()}
    engine.close()
    return out, lrs


@pytest.mark.parametrize("after_initialize", (False, True))
def test_a_client_scheduler_sets_every_steps_lr_as_with_torch(after_initialize):
    ref = reference()
    assert_trained(ref, initial_weights("mlp"), "AdamW + LambdaLR")
    runs = {stage: train(stage, after_initialize) for stage in (0, 1, 2, 3)}
    expected_lrs = [[cases.LR * warmup_then_decay(s)] * 2 for s in range(STEPS)]
    for stage, (master, lrs) in runs.items():
        assert [lr for step in lrs for lr in step] == pytest.approx(
            [lr for step in expected_lrs for lr in step], rel=1e-12), f"stage {stage} lrs"
        assert_close(master, ref, f"stage {stage} with a client scheduler vs torch")
        assert_bitwise(master, runs[0][0], f"stage {stage} vs stage 0")


@pytest.mark.parametrize("after_initialize", (False, True))
def test_an_lr_held_across_steps_and_a_checkpoint_in_between_change_nothing(tmp_path,
                                                                            after_initialize):
    ref = reference(warmup_hold_decay)
    for stage in (0, 3):
        master, lrs = train(stage, after_initialize, warmup_hold_decay, tmp_path / str(stage))
        assert [step[0] for step in lrs] == pytest.approx(
            [cases.LR * warmup_hold_decay(s) for s in range(STEPS)], rel=1e-12), f"stage {stage}"
        assert_close(master, ref, f"stage {stage}, lr held, a checkpoint on the way, vs torch")


def test_a_client_scheduler_that_cannot_apply_is_refused():
    model = cases.build("mlp")
    opt = client_optimizer(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_decay)
    with pytest.raises(zero.ZeroError, match=r"both the config's \"scheduler\" block and an "
                                             r"lr_scheduler"):
        zero.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                        config=config(2, with_scheduler_block=True))
    other = torch.optim.AdamW(cases.build("mlp").parameters(), lr=cases.LR)
    with pytest.raises(zero.ZeroError, match="not built on the optimizer passed to initialize"):
        zero.initialize(model=model, optimizer=opt,
                        lr_scheduler=torch.optim.lr_scheduler.LambdaLR(other, warmup_then_decay),
                        config=config(2))
