"""engine.timings(): the C++ engine's phases and, under "python", the package's own work (issue
34's profile), counted per call and reset on request. One rank, in this process."""
import pytest

import cases
import zero

STEPS = 3
ALONE_MIN_SLICE = 1 << 14  # GradientReducer::kAloneMinSliceElems (zero/engine/gradient_reducer.h)


def train(stage, steps=STEPS):
    model = cases.build("transformer")
    cfg = {"train_micro_batch_size_per_gpu": cases.GLOBAL_BATCH, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": cases.LR}},
           "zero_optimization": {"stage": stage}}
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    # One rank: a unit's slice is the whole unit (a module's own parameters).
    alone = sum(1 for m in model.modules()
                if sum(p.numel() for p in m.parameters(recurse=False)) >= ALONE_MIN_SLICE)
    for step in range(steps):
        x, y = cases.global_batch("transformer", step)
        engine.backward(cases.loss_fn("transformer", engine(x), y))
        engine.step()
    return engine, trainable, alone


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_timings_count_the_hooks_checks_and_reductions(stage):
    engine, trainable, alone = train(stage)
    t = engine.timings(reset=True)
    py = t["python"]
    # One hook per trainable parameter per micro-step (the tied embedding once), two parameter
    # checks per micro-step (forward and step).
    assert py["grad_hooks"] == trainable * STEPS
    assert py["check_unchanged_calls"] == 2 * STEPS
    assert py["grad_hook_s"] > 0 and py["check_unchanged_s"] > 0
    assert t["optimizer_s"] > 0
    # The large units (qkv, fc, out) are reduced alone, the small ones in buckets.
    assert alone > 0
    assert t["units_alone"] == alone * STEPS
    assert t["buckets"] > t["units_alone"]
    after = engine.timings()
    assert after["python"] == {k: 0 for k in py}
    assert after["buckets"] == 0 and after["units_alone"] == 0 and after["optimizer_s"] == 0
    engine.close()


def test_stage3_makes_each_placeholder_once():
    """Stage 3 gathers and releases every unit in every micro-step: a released parameter gets the
    placeholder made for it at start (making one per release cost more than a small unit's
    gather, issue 34), and the tensors over gathered copies are kept per address, a few at most."""
    engine, trainable, _ = train(3, steps=1)
    fetcher = engine._fetcher
    placeholders = {i: t.data_ptr() for i, t in fetcher.placeholders.items()}
    assert len(placeholders) == sum(len(v) for v in fetcher.params_of.values())
    for step in range(1, 4):
        x, y = cases.global_batch("transformer", step)
        engine.backward(cases.loss_fn("transformer", engine(x), y))
        engine.step()
    assert not fetcher.gathered and not fetcher.by_storage
    for params in fetcher.params_of.values():
        for r in params:
            assert r.param.data.data_ptr() == placeholders[r.index]
            assert 1 <= len(fetcher.views[r.index]) <= 4
    engine.close()
