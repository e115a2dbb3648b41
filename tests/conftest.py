"""Shared test setup: CPU only, deterministic, quiet; how the run is spread over processes."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest  # noqa: E402
import torch  # noqa: E402

# In a parallel run (pytest-xdist, the default: pyproject's addopts) each worker computes with one
# thread: the workers already keep every core busy, and more threads than cores slow them all.
IN_A_WORKER = "PYTEST_XDIST_WORKER" in os.environ
torch.set_num_threads(1 if IN_A_WORKER else max(1, min(2, os.cpu_count() or 1)))

# The files that take longest (docs/testing.md, "Where its time goes"), started first so that no
# worker is still on one of them long after the others have run out of work. xdist keeps this order
# only with --no-loadscope-reorder (pyproject's addopts): by default it starts the files with the
# most tests first, which left the one-test 80 s stress run and Ray's 3-minute start to the end.
LONGEST_FIRST = (
    "test_serve_replicas.py", "test_studio_browser.py", "test_durable_restart.py", "test_durable_workflows.py",
    "test_node_editor_browser.py", "test_gpu_check.py", "test_stress.py", "test_builtin_v2_scores.py",
    "test_reliability_app.py", "test_app_cli.py", "test_readme_examples.py", "test_serving_benchmark.py",
    "test_durable_page.py", "test_video_v2_checkpoint.py", "test_workflow_grid_benchmark.py", "test_quiet_start.py",
    "test_readme_claims.py", "test_flux_packing.py", "test_step_cache.py", "test_workflow_client.py",
    "test_lora_parity.py", "test_outline_v2.py",
)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker a core and one more (at most 8), so one worker's waits on a studio
    process, a browser or Ray leave no core idle. Measured on a quiet 2-core machine (docs/testing.md):
    3 workers 7 min 07 s, 2 workers 7 min 28 s, 4 workers 8 min 49 s (each worker imports torch,
    diffusers and Gradio, and four contend for two cores: 2 minutes more CPU time)."""
    return min(8, (os.cpu_count() or 1) + 1)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _deterministic_torch():
    torch.manual_seed(0)
    yield
