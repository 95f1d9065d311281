"""gpusnap's console lines (gpusnap.console): whole lines everywhere, a status line on a terminal only."""

from __future__ import annotations

import io
import os
import pty
import select

from gpusnap.console import Console


def test_off_a_terminal_only_whole_lines_by_verbosity():
    stream = io.StringIO()
    console = Console(stream, verbosity=1)
    console.show("gpusnap: writing snapshot 000001: 1 MB read")
    console.say("snapshot 000001 committed", level=1)
    console.say("the program connected", level=2)
    console.say("restore refused", prefix="rank 1: ")
    assert stream.getvalue() == "gpusnap: snapshot 000001 committed\ngpusnap: rank 1: restore refused\n"


def test_on_a_terminal_a_line_clears_the_status_line_first():
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            console = Console(stream)
            console.show("gpusnap: writing snapshot 000001: 1 MB read")
            console.say("snapshot 000001 committed")
            console.clear()  # nothing shown any more: writes nothing
        text = _read_all(master)
    finally:
        os.close(master)
        os.close(slave)
    assert text == "\r\033[Kgpusnap: writing snapshot 000001: 1 MB read\r\033[Kgpusnap: snapshot 000001 committed\r\n"


def _read_all(master: int) -> str:
    """What the terminal holds: a pty hands it over in pieces, not always in one read."""
    got = b""
    while select.select([master], [], [], 0.5)[0]:
        data = os.read(master, 4096)
        if not data:
            break
        got += data
    return got.decode()
