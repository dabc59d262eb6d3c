"""Progress of a long run, on stderr and only when stderr is a terminal: never in piped output or --json stdout.

Drawn by tqdm, which transformers already requires (so no new dependency); a bar appears only once a run has
lasted `delay` seconds, so quick commands stay quiet. Without tqdm, or off a terminal, every call is a no-op.
"""
from __future__ import annotations

import sys

DELAY_S = 1.5   # runs shorter than this never show a bar


class Progress:
    """`with Progress(total, "label") as bar: ... bar.update()`; or pass `bar.set` as a (done, total) callback."""

    def __init__(self, total: int | None, label: str = "", *, unit: str = "it", position: int | None = None,
                 enabled: bool | None = None, delay_s: float | None = None):
        self._bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=label, unit=unit, position=position,
                         delay=DELAY_S if delay_s is None else delay_s, leave=False,
                         file=sys.stderr, dynamic_ncols=True)

    @property
    def active(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def set(self, done: int, total: int | None = None) -> None:
        """Callback form for lower layers (serving/ must not import cli/): done of total so far."""
        if self._bar is None:
            return
        if total is not None and total != self._bar.total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def describe(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(label, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
