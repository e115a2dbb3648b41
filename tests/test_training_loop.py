"""The trainers' shared schedule: time-or-steps progress, the warm-up cosine, EMA, safe saves."""

import math

import torch

from tools.training_loop import (
    cosine_lr,
    ema_update,
    progress_fraction,
    save_atomically,
)


def test_progress_is_whichever_comes_first_steps_or_time():
    assert progress_fraction(50, 100, elapsed=0.0, max_minutes=0.0) == 0.5  # steps only
    assert progress_fraction(10, 100, elapsed=30.0, max_minutes=1.0) == 0.5  # time leads
    assert progress_fraction(90, 100, elapsed=30.0, max_minutes=1.0) == 0.9  # steps lead
    assert progress_fraction(10, 100, elapsed=600.0, max_minutes=1.0) == 1.0  # capped


def test_cosine_warms_up_then_falls_to_its_floor():
    assert math.isclose(cosine_lr(1e-3, 0.0, step=0, warmup=10), 1e-4)
    assert math.isclose(cosine_lr(1e-3, 0.0, step=9, warmup=10), 1e-3)
    assert math.isclose(cosine_lr(1e-3, 0.5, step=500, warmup=10), 1e-3 * (0.05 + 0.95 * 0.5))
    assert math.isclose(cosine_lr(1e-3, 1.0, step=1000, warmup=10), 5e-5)


def test_ema_moves_each_weight_by_one_minus_decay():
    model, ema = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        ema.weight.fill_(0.0)
    ema_update(ema, model, decay=0.9)
    assert torch.allclose(ema.weight, torch.full_like(ema.weight, 0.1))


def test_save_replaces_the_checkpoint_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "run.pt"
    save_atomically({"step": 1}, path)
    save_atomically({"step": 2}, path)
    assert torch.load(path)["step"] == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]
