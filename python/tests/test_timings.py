"""engine.timings(): the C++ engine's phases and, under "python", the package's own work (issue
34's profile), counted per call and reset on request. One rank, in this process."""
import pytest
import torch

import cases
import zero

STEPS = 3
ALONE_MIN_SLICE = 1 << 14  # GradientReducer::kAloneMinSliceElems (zero/engine/gradient_reducer.h)


def train(stage, steps=STEPS, **zero_optimization):
    model = cases.build("transformer")
    cfg = {"train_micro_batch_size_per_gpu": cases.GLOBAL_BATCH, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": cases.LR}},
           "zero_optimization": {"stage": stage, **zero_optimization}}
    engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    trainable = sum(1 for p in model.parameters() if p.requires_grad)
    # One rank: a unit's slice is the whole unit. A parameter of OWN_UNIT_MIN_NUMEL elements or
    # more is a unit of its own (here the same bound), a module's smaller ones share one.
    alone = sum(1 for p in model.parameters() if p.numel() >= ALONE_MIN_SLICE)
    alone += sum(1 for m in model.modules()
                 if sum(p.numel() for p in m.parameters(recurse=False)
                        if p.numel() < ALONE_MIN_SLICE) >= ALONE_MIN_SLICE)
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
    # One hook per trainable parameter per micro-step (the tied embedding once), one parameter
    # check per micro-step (forward's: step() does not check again).
    assert py["grad_hooks"] == trainable * STEPS
    assert py["check_unchanged_calls"] == STEPS
    assert py["grad_hook_s"] > 0 and py["check_unchanged_s"] > 0
    assert t["optimizer_s"] > 0
    # The large units (the weights) are reduced alone, the small ones (biases, norms) in buckets.
    assert alone > 0
    assert t["units_alone"] == alone * STEPS
    assert t["buckets"] > t["units_alone"]
    after = engine.timings()
    assert after["python"] == {k: 0 for k in py}
    assert after["buckets"] == 0 and after["units_alone"] == 0 and after["optimizer_s"] == 0
    engine.close()


def test_stage3_makes_each_placeholder_once_and_binds_persistent_units_once():
    """Stage 3 gathers and releases every unit over the persistence thresholds in every
    micro-step: a released parameter gets the placeholder made for it at start (making one per
    release cost more than a small unit's gather, issue 34), and the tensors over gathered copies
    are kept per address, a few at most. A persistent unit is never gathered or released by the
    package: its parameters view the engine's copy, which each step refreshes in place, and its
    modules have no hooks."""
    engine, trainable, _ = train(3, steps=1, stage3_param_persistence_threshold=100)
    fetcher = engine._fetcher
    assert fetcher.persistent and set(fetcher.params_of) - fetcher.persistent  # both kinds
    placeholders = {i: t.data_ptr() for i, t in fetcher.placeholders.items()}
    assert len(placeholders) == sum(len(v) for v in fetcher.params_of.values())
    bound = {r.index: r.param.data_ptr() for u in fetcher.persistent for r in fetcher.params_of[u]}
    # A module whose parameters are all persistent has no hooks; the others a pre- and a post-hook.
    unit_of = {id(r.param): u for u, rs in fetcher.params_of.items() for r in rs}
    hooked = [m for m in engine.module.modules()
              if {unit_of[id(p)] for p in m.parameters(recurse=False)} - fetcher.persistent]
    assert len(fetcher.hooks) == 2 * len(hooked)
    before = {r.index: r.param.detach().clone() for u in fetcher.persistent
              for r in fetcher.params_of[u]}
    for step in range(1, 4):
        x, y = cases.global_batch("transformer", step)
        engine.backward(cases.loss_fn("transformer", engine(x), y))
        engine.step()
    assert not fetcher.gathered and not fetcher.by_storage
    for u, params in fetcher.params_of.items():
        for r in params:
            if u in fetcher.persistent:
                # Where it was, holding the stepped values (fp32: the master weights).
                assert r.param.data_ptr() == bound[r.index] != placeholders[r.index]
                assert len(fetcher.views[r.index]) == 1
                master = engine.gather_master(r.name)
                assert torch.equal(r.param.detach().reshape(master.shape), master)
                assert not torch.equal(r.param.detach(), before[r.index])
            else:
                assert r.param.data.data_ptr() == placeholders[r.index]
                assert 1 <= len(fetcher.views[r.index]) <= 4
    engine.close()
    # Closing hands every parameter its placeholder: none views the engine's freed memory.
    for params in fetcher.params_of.values():
        for r in params:
            assert r.param.data_ptr() == placeholders[r.index]


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_gradients_reduced_where_autograd_wrote_them_train_bitwise_as_copied(stage):
    """A parameter alone in its unit (a Linear's weight, with or without a bias beside it), large
    enough to be reduced without a bucket: the engine reduces its gradient in autograd's tensor
    instead of copying it into a slot (zero_engine_grad_lend), with bitwise the result of the copy.
    ZERO_GRAD_IN_PLACE=0's switch (engine._lend_grads) turns it off for the comparison."""
    import copy

    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(256, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage}}
    runs = []
    for lend in (True, False):
        model = copy.deepcopy(base)
        engine, *_ = zero.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        engine._lend_grads = lend
        g = torch.Generator().manual_seed(1)
        for _ in range(3 * 2):
            x, y = torch.randn(8, 256, generator=g), torch.randn(8, 16, generator=g)
            engine.backward(torch.nn.functional.mse_loss(engine(x), y))
            engine.step()
        assert engine.global_steps == 3
        masters = {n: engine.gather_master(n) for n, _ in base.named_parameters()}
        runs.append((engine.timings()["python"]["grads_lent"], masters))
        assert not engine._lent  # released once step() returned
        engine.close()
    (lent, with_lending), (copied, without) = runs
    # The two larger weights (65,536 and 32,768 elements; the second beside its bias), every
    # micro-step; the last Linear (2,048 + 16) shares one unit and is copied.
    assert lent == 2 * 3 * 2 and copied == 0
    for name, p in base.named_parameters():
        assert torch.equal(with_lending[name], without[name]), name
        assert not torch.equal(with_lending[name], p.detach()), name  # the steps moved it


def test_stage3_units_the_engine_keeps_stay_bound_from_forward_to_backward():
    """Forward releases each unit; the engine keeps the ones its trace re-gathers within
    stage3_max_reuse_distance (zero_engine_release_kept), and their parameters keep viewing its
    copy, so backward's re-gather binds nothing. With a reuse distance of 0 every release frees
    and backward binds each unit again. Both train bitwise alike, and nothing stays bound after a
    step."""
    runs = {}
    for distance in (None, 0):
        extra = {} if distance is None else {"stage3_max_reuse_distance": distance}
        engine, _, _ = train(3, steps=2, stage3_param_persistence_threshold=100, **extra)
        fetcher = engine._fetcher
        placeholders = {i: t.data_ptr() for i, t in fetcher.placeholders.items()}
        gathered = set(fetcher.params_of) - fetcher.persistent
        assert gathered
        views, view = [0], fetcher._view

        def counted(r):
            views[0] += 1
            return view(r)
        fetcher._view = counted
        x, y = cases.global_batch("transformer", 2)
        loss = cases.loss_fn("transformer", engine(x), y)
        forward_views = views[0]
        assert not fetcher.gathered  # every module's units released after its forward
        bound = {r.index for u in gathered for r in fetcher.params_of[u]
                 if r.param.data_ptr() != placeholders[r.index]}
        kept = set(fetcher.kept)
        engine.backward(loss)
        engine.step()
        assert not fetcher.gathered and not fetcher.kept and not fetcher.by_storage
        assert all(r.param.data_ptr() == placeholders[r.index]
                   for u in gathered for r in fetcher.params_of[u])
        runs[distance] = (forward_views, views[0] - forward_views, kept, bound,
                          {r.name: engine.gather_master(r.name)
                           for rs in fetcher.params_of.values() for r in rs})
        engine.close()
    (f_keep, b_keep, kept, bound, keep), (f_free, b_free, none_kept, none_bound, free) = \
        runs[None], runs[0]
    # Forward binds every gathered unit's parameters once; freed, the tied embedding's unit (read
    # again by the output layer) once more.
    assert f_keep == sum(len(fetcher.params_of[u]) for u in gathered) < f_free
    # Kept: the units that backward re-gathers (their views saved by autograd; not those of
    # biases alone), still bound after forward; backward binds nothing.
    assert kept and kept < gathered
    assert bound == {r.index for u in kept for r in fetcher.params_of[u]}
    assert b_keep == 0
    # Distance 0: kept only where the very next gather is the same unit; backward binds the units
    # whose views autograd saved again.
    assert len(none_kept) < len(kept)
    assert none_bound == {r.index for u in none_kept for r in fetcher.params_of[u]}
    assert b_free > 0
    initial = cases.build("transformer").state_dict()
    for name, master in keep.items():
        assert torch.equal(master, free[name]), name
        assert not torch.equal(master, initial[name].reshape(master.shape)), name
