"""Shared test setup: the `gpu` marker skips cleanly where no NVIDIA GPU is present."""
from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
TINY = DATA / "tiny"


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA not available here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return TINY
