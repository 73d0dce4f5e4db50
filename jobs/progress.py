"""Progress: a tqdm bar on a terminal (or `enabled=True`: notebooks), periodic one-line
logs when not a TTY (what `ray job logs` shows), nothing with `enabled=False`."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


class Progress:
    def __init__(self, total_units: int, enabled: bool | None, interval: float = 10.0) -> None:
        bar = sys.stderr.isatty() if enabled is None else enabled
        self.bar = tqdm(total=total_units, unit="unit", dynamic_ncols=True) if bar else None
        self.log = enabled is None and not bar
        self.total_units, self.interval = total_units, interval
        self.units = self.rows = self.tokens = 0
        self.start = self.last_log = time.monotonic()

    def update(self, rows: int, tokens: int) -> None:
        self.units, self.rows, self.tokens = self.units + 1, self.rows + rows, self.tokens + tokens
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.tokens / elapsed
        if self.bar is not None:
            self.bar.set_postfix(rows=self.rows, tok_s=f"{rate:,.0f}", refresh=False)
            self.bar.update(1)
        if not self.log:
            return
        now = time.monotonic()
        if now - self.last_log >= self.interval or self.units == self.total_units:
            self.last_log = now
            eta = elapsed / self.units * (self.total_units - self.units)
            print(f"[pooljobs] units {self.units}/{self.total_units} rows {self.rows:,} "
                  f"tokens/s {rate:,.0f} elapsed {elapsed:,.0f}s eta {eta:,.0f}s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
