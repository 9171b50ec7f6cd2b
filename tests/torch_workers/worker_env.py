"""What the training scripts of the multi-process tests share: their dataset and common settings.

Each script runs as ``python tests/torch_workers/<name>.py`` (its folder is then first on the path),
reads its settings from ``TEST_*`` variables and writes what a test checks under ``TEST_OUT_DIR``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch


class Indexed(torch.utils.data.Dataset):
    """Linear-regression examples ``y = x·(1..dim) + noise``, each returned with its index (so a
    test can check which examples every step saw); the same for a given seed."""

    def __init__(self, n: int, dim: int = 4, seed: int = 7, noise: float = 0.1) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=gen)
        self.y = self.x @ torch.arange(1.0, dim + 1.0) + noise * torch.randn(n, generator=gen)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


@dataclass(frozen=True)
class Settings:
    """TEST_OUT_DIR, TEST_TAG (where and under which name to write), TEST_N, TEST_M0, TEST_EPOCHS
    (dataset size, initial batch size, epochs)."""

    out: Path
    tag: str
    n: int
    m0: int
    epochs: int


def settings(n: int, m0: int, epochs: int = 3) -> Settings:
    """The common settings from the environment; the arguments are the script's defaults."""
    return Settings(
        out=Path(os.environ["TEST_OUT_DIR"]),
        tag=os.environ.get("TEST_TAG", "run"),
        n=int(os.environ.get("TEST_N", str(n))),
        m0=int(os.environ.get("TEST_M0", str(m0))),
        epochs=int(os.environ.get("TEST_EPOCHS", str(epochs))),
    )
