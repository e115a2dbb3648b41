"""The trainers' shared schedule: time-or-steps progress, the warm-up cosine, EMA, safe saves, and the
step loop every stage runs."""

import math
from types import SimpleNamespace

import numpy as np
import torch

from tools.training_loop import (
    Schedule,
    cosine_lr,
    ema_update,
    progress_fraction,
    run_steps,
    save_atomically,
    train_vae_stage,
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


def test_the_step_loop_runs_its_schedule_then_saves_the_state_done():
    torch.manual_seed(0)
    model, ema = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    ema.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    state = {"step": 0, "elapsed": 0.0, "done": False}
    learning_rates, fractions, seen, saves = [], [], [], []

    def loss_at(step: int, fraction: float):
        learning_rates.append(optimizer.param_groups[0]["lr"])
        fractions.append(fraction)
        return model(torch.ones(4, 3)).pow(2).mean(), {"figure": 1.0}

    run_steps("tiny", state, model, optimizer, Schedule(base_lr=0.1, warmup=2, steps=4, minutes=0.0), loss_at,
              lambda: saves.append(dict(state)), checkpoint_minutes=60.0, ema=ema, ema_decay=0.5,
              after_step=lambda progress: seen.append(progress["step"]))
    assert state["step"] == 4 and state["done"] is True and state["loss_avg"] > 0
    assert fractions == [0.0, 0.25, 0.5, 0.75] and seen == [1, 2, 3, 4]
    assert learning_rates == [cosine_lr(0.1, f, step, warmup=2) for step, f in enumerate(fractions)]
    assert [saved["done"] for saved in saves] == [True]  # one save, at the end (no periodic one in 60 min)
    assert not torch.equal(ema.weight, model.weight)  # the EMA trails the trained weights


def test_a_replayed_schedule_stops_where_the_recorded_one_did():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    state = {"step": 0, "elapsed": 0.0, "done": False}
    replay = [0.0, 0.5, 0.9]
    run_steps("replay", state, model, optimizer, Schedule(0.1, 1, steps=1000, minutes=0.0),
              lambda step, fraction: (model(torch.ones(1, 2)).sum() ** 2, {}), lambda: None, 60.0,
              fraction_at=lambda step: replay[step] if step < len(replay) else 1.0)
    assert state["step"] == 3 and state["done"] is True


def test_the_vae_stage_resumes_its_checkpoint_and_draws_from_the_seed_and_step(tmp_path):
    args = SimpleNamespace(work_dir=tmp_path, vae_lr=1e-2, vae_steps=5, vae_minutes=0.0, seed=7, kl_weight=0.0,
                           checkpoint_minutes=0.0)  # a checkpoint after every step
    draws, kill_at = [], [3]

    def batch_at(step: int, rng: np.random.Generator) -> torch.Tensor:
        if step in kill_at:
            raise KeyboardInterrupt  # the run is killed here
        draws.append((step, float(rng.random())))
        return torch.ones(2, 3)

    def vae_loss(vae, batch, kl_weight):
        return vae(batch).pow(2).mean(), {"l1": 0.0}

    try:
        train_vae_stage(args, torch.nn.Linear(3, 3), batch_at, vae_loss, warmup=1, log_every=1)
    except KeyboardInterrupt:
        pass
    first_run = np.random.default_rng([7, 0])
    assert draws == [(step, first_run.random()) for step in range(3)]
    assert torch.load(tmp_path / "vae.pt", weights_only=False)["state"]["step"] == 3

    draws.clear()
    kill_at.clear()
    resumed = torch.nn.Linear(3, 3)
    train_vae_stage(args, resumed, batch_at, vae_loss, warmup=1, log_every=1)
    second_run = np.random.default_rng([7, 3])  # seeded from the step it resumed at
    assert draws == [(step, second_run.random()) for step in (3, 4)]
    saved = torch.load(tmp_path / "vae.pt", weights_only=False)
    assert saved["state"]["step"] == 5 and saved["state"]["done"] is True
    assert torch.equal(saved["model"]["weight"], resumed.weight)

    draws.clear()
    train_vae_stage(args, torch.nn.Linear(3, 3), batch_at, vae_loss, warmup=1, log_every=1)
    assert draws == []  # done: nothing more to train
