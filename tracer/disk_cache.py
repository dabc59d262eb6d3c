"""Traces cached on disk, so a repeated command skips loading torch and transformers altogether.

A cache entry is keyed by the model config, the request, the trace options, the installed torch and
transformers releases, and a fingerprint of the tracer's own source: any change to one of them is a
miss. TRACECOST_CACHE_DIR moves the cache (default ~/.cache/tracecost); TRACECOST_NO_CACHE=1 turns it off.
Entries are pickles this module wrote itself; a file that fails to load is ignored and rewritten.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

FORMAT = 1


def _directory(kind: str = "traces") -> Path | None:
    if os.environ.get("TRACECOST_NO_CACHE") == "1":
        return None
    root = os.environ.get("TRACECOST_CACHE_DIR") or Path.home() / ".cache" / "tracecost"
    return Path(root) / kind


@lru_cache(maxsize=1)
def _fingerprint() -> str:
    """Versions of what shapes a trace: torch, transformers, and this package's source."""
    h = hashlib.sha256(str(FORMAT).encode())
    for dist in ("torch", "transformers"):
        try:
            h.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


def _path(key, kind: str = "traces") -> Path | None:
    directory = _directory(kind)
    if directory is None:
        return None
    digest = hashlib.sha256((_fingerprint() + repr(key)).encode()).hexdigest()
    return directory / f"{digest}.pkl"


def load(key, kind: str = "traces"):
    """`kind`: traces, or verdicts (the layer dedup self-test's, per model class)."""
    path = _path(key, kind)
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - a damaged or stale entry is just a miss
        return None


def store(key, value, kind: str = "traces") -> None:
    path = _path(key, kind)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False) as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, path)
    except OSError:
        pass  # a read-only or full disk only costs speed
