"""Generated tokens to text, a piece at a time, as a client reads it.

Tokens are decoded in a window (the last few tokens already shown, then the
new ones) so a character split over several byte-level tokens is shown only
once whole, and decoding stays O(1) per token. Stop strings end generation:
text that could still grow into one is held back until it cannot.
"""

from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tok, self.stop = tokenizer, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self._prefix = 0            # window start
        self._read = 0              # ids up to here are shown
        self._held = ""             # decoded, not sent: may start a stop string
        self.text = ""              # everything sent
        self.stopped = False        # a stop string was found

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        """Adds a token; returns the text to send now ("" while a character or
        a possible stop string is incomplete)."""
        self.ids.append(int(token))
        shown = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if len(full) <= len(shown) or full.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return self._release(self._held + full[len(shown):])

    def _release(self, pending: str) -> str:
        if not self.stop:
            return self._send(pending)
        hits = [i for i in (pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return self._send(pending[:min(hits)])
        # hold back the longest tail that begins some stop string
        keep = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(pending)), keep, -1):
                if s.startswith(pending[-n:]):
                    keep = n
                    break
        self._held = pending[len(pending) - keep:]
        return self._send(pending[:len(pending) - keep])

    def _send(self, piece: str) -> str:
        self.text += piece
        return piece

    def flush(self) -> str:
        """At the end: the text still held back or undecoded (nothing after a
        stop string)."""
        if self.stopped:
            return ""
        shown = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        pending = self._held + (full[len(shown):] if len(full) > len(shown) else "")
        self._held = ""
        hits = [i for i in (pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            pending = pending[:min(hits)]
        return self._send(pending)
