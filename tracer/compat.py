"""The transformers and torch releases tracecost was tested with.

tracecost plugs into transformers internals (AttentionInterface, ExpertsInterface, the Cache
layer API, the MLA attention modules) that change between releases. Outside the tested range
it stops with a clear message rather than produce silently wrong numbers.
"""
from __future__ import annotations

import os

from .model_source import ModelError

TRANSFORMERS_TESTED = ((5, 17), (5, 24))   # inclusive minor range
TORCH_MIN = (2, 6)
OVERRIDE_ENV = "TRACECOST_ALLOW_UNTESTED"


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def check_versions() -> None:
    import torch
    if os.environ.get(OVERRIDE_ENV) == "1":
        return
    tv = _version_tuple(transformers_version())
    low, high = TRANSFORMERS_TESTED
    if not (low <= tv <= high):
        raise ModelError(
            f"transformers {transformers_version()} is outside the tested range "
            f"{low[0]}.{low[1]}-{high[0]}.{high[1]}; install a tested release "
            f"(pip install 'transformers>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}') or set {OVERRIDE_ENV}=1")
    if _version_tuple(torch.__version__) < TORCH_MIN:
        raise ModelError(f"torch {torch.__version__} is older than {TORCH_MIN[0]}.{TORCH_MIN[1]}")
