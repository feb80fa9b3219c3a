"""Progress with an ETA on standard error, for every step that takes more than a few seconds.

A `tqdm` bar when tqdm is installed (it is a dependency of the project; a bare GPU image may lack
it), otherwise a plain line at most every few seconds: what is done, of how much, the time spent
and the time left at the rate so far. A disabled progress prints nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

TIME_BAR = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"  # a time budget: no rate


class Progress:
    """``total`` units of work named ``desc``; `update` as they finish, `close` (or ``with``) at the end."""

    def __init__(
        self,
        desc: str,
        total: float,
        unit: str,
        *,
        enabled: bool = True,
        every: float = 5.0,
        ticking: bool = False,
    ):
        """``ticking`` (a time budget, unit ``"s"``): a background thread advances the bar to the
        seconds spent every half second, so that a long step inside the budget still moves it."""
        self.desc, self.total, self.unit, self.enabled, self.every = desc, total, unit, enabled, every
        self._lock = threading.RLock()
        self._ticker: threading.Thread | None = None
        self.done: float = 0
        self.start = self.last = time.monotonic()
        self.postfix = ""
        self.closed = False
        self.shown: float | None = None  # what the last plain line showed
        self._bar: Any = None
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        interactive = sys.stderr.isatty()
        self._bar = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            file=sys.stderr,
            mininterval=0.5 if interactive else every,
            dynamic_ncols=interactive,
            bar_format=TIME_BAR if unit == "s" else None,
        )
        if ticking and unit == "s":
            self._ticker = threading.Thread(target=self._tick, name=f"progress: {desc}", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        """Advance a time bar to the seconds spent, until it closes."""
        while not self.closed:
            time.sleep(0.5)
            with self._lock:
                if not self.closed:
                    self.advance_to(max(self.done, time.monotonic() - self.start))

    def update(self, amount: float = 1, **postfix: object) -> None:
        """``amount`` more units done; ``postfix`` shows beside the bar (counts, the best statistic)."""
        self.advance_to(self.done + amount, **postfix)

    def advance_to(self, done: float, **postfix: object) -> None:
        """``done`` units done in all (a time budget advances to the seconds spent)."""
        with self._lock:
            self._advance_to(done, postfix)

    def _advance_to(self, done: float, postfix: dict[str, object]) -> None:
        done = min(done, self.total)
        step, self.done = done - self.done, done
        if postfix:
            self.postfix = ", ".join(f"{k}={v}" for k, v in postfix.items())
        if not self.enabled or self.closed:
            return
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.update(step)
            return
        now = time.monotonic()
        if now - self.last >= self.every or self.done >= self.total:
            self._write(now)

    def line(self, now: float | None = None) -> str:
        """The plain progress line: done of total, elapsed, ETA at the rate so far, postfix."""
        elapsed = (time.monotonic() if now is None else now) - self.start
        eta = f"{elapsed / self.done * (self.total - self.done):.0f}s" if self.done > 0 else "?"
        fraction = self.done / self.total if self.total else 1.0
        tail = f" ({self.postfix})" if self.postfix else ""
        return (
            f"[{self.desc}] {self.done:g}/{self.total:g} {self.unit} ({fraction:.0%}), "
            f"{elapsed:.0f}s elapsed, ETA {eta}{tail}"
        )

    def close(self) -> None:
        """Finish the bar (the plain form prints its last line)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and not self.closed and self.shown != self.done:
            self._write(time.monotonic())
        self.closed = True

    def _write(self, now: float) -> None:
        self.last, self.shown = now, self.done
        sys.stderr.write(self.line(now) + "\n")
        sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
