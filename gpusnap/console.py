"""What gpusnap writes on the console: whole ``gpusnap: ...`` lines on stderr, and on a terminal
one status line redrawn in place (a long write's or a long restore's progress).

Both the supervisor (``launch``) and the restore in the trainee (``restore.replay``) write
through a ``Console``, so the lines read the same and a status line is always cleared before a
whole line is written over it. Output never stops a run: a closed or broken stream is ignored.

The floor of the package (as ``errors`` and ``knobs``), standard library only: the supervisor
imports it, and it never imports torch.
"""

from __future__ import annotations

import os
import sys

CLEAR_LINE = "\r\033[K"  # back to the line's start, erase to its end


class Console:
    """Lines on ``stream`` (None: whatever ``sys.stderr`` is at each write). ``verbosity``:
    0 ``--quiet``, 1 the default, 2 ``--verbose``; a line of ``level`` shows when ``level <=
    verbosity`` (0: problems and stops, always). ``status``: whether a status line may be drawn
    (only ever on a terminal: logs get whole lines)."""

    def __init__(self, stream=None, verbosity: int = 1, status: bool = True):
        self._stream = stream
        self.verbosity = verbosity
        self._status = status
        self.shown = False  # a status line is on the screen

    @property
    def stream(self):
        return self._stream if self._stream is not None else sys.stderr

    def say(self, text: str, level: int = 0, prefix: str = "") -> None:
        """One ``gpusnap:`` line, when the verbosity lets lines of ``level`` through."""
        if level <= self.verbosity:
            self.write(f"gpusnap: {prefix}{text}\n")

    def write(self, text: str) -> None:
        """Whole lines, in one write (the lines of ranks sharing a terminal do not interleave
        mid-line), after clearing the status line."""
        self.clear()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def status_enabled(self) -> bool:
        """Would ``show`` draw: status lines asked for, and the stream is a terminal."""
        if not self._status:
            return False
        try:
            return os.isatty(self.stream.fileno())
        except (AttributeError, OSError, ValueError):
            return False

    def show(self, text: str) -> None:
        """Draw ``text`` as the status line, over the one shown before (nothing off a terminal)."""
        if not self.status_enabled():
            return
        try:
            self.stream.write(CLEAR_LINE + text)
            self.stream.flush()
            self.shown = True
        except (OSError, ValueError):
            pass

    def clear(self) -> None:
        """Erase the status line, if one is shown."""
        if self.shown:
            self.shown = False
            try:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            except (OSError, ValueError):
                pass
