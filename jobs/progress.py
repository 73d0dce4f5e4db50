"""Progress: a tqdm bar on a terminal, periodic one-line logs otherwise (`ray job logs`)."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


class Progress:
    def __init__(self, total_units: int, total_rows: int | None, enabled: bool | None, interval: float = 10.0) -> None:
        self.bar = tqdm(total=total_units, unit="unit", dynamic_ncols=True) if (
            enabled if enabled is not None else sys.stderr.isatty()) else None
        self.total_units, self.total_rows, self.interval = total_units, total_rows, interval
        self.units = self.rows = self.tokens = 0
        self.start = self.last_log = time.monotonic()

    def update(self, rows: int, tokens: int) -> None:
        self.units, self.rows, self.tokens = self.units + 1, self.rows + rows, self.tokens + tokens
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.tokens / elapsed
        if self.bar is not None:
            self.bar.set_postfix(rows=self.rows, tok_s=f"{rate:,.0f}", refresh=False)
            self.bar.update(1)
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
