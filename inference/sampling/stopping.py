"""Stop strings over a stream of text deltas.

Owns: holding back text that might be the start of a stop string, so a client never sees a
stop string half-printed and then retracted. Must not know: tokens, models.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.pending = ""  # text not yet released: it may begin a stop string
        self.is_stopped = False

    def feed(self, delta: str) -> str:
        """Add decoded text; return what is safe to show. Sets `is_stopped` on a match."""
        if not self.stop:
            return delta
        self.pending += delta
        hits = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.is_stopped = True
            released, self.pending = self.pending[: min(hits)], ""
            return released
        keep = self._longest_stop_prefix_suffix()
        released = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return released

    def flush(self) -> str:
        released, self.pending = self.pending, ""
        return released

    def _longest_stop_prefix_suffix(self) -> int:
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.pending)), best, -1):
                if self.pending.endswith(s[:n]):
                    best = n
                    break
        return best
