"""The files a process the program starts may write: the paths its command line names.

A child made by exec (``subprocess``, ``os.system``, ``os.posix_spawn``, ``os.exec*``,
``os.spawn*``) runs without gpusnap's audit hook, so its writes go unseen. What it writes is
most often named on its command line: an evaluation script handed the results file it appends
to, a ``cp`` onto the best checkpoint, a shell's ``>> log``. Those paths are taken as the
program's files (``watch``'s kind ``child``) before the child starts, so that a restart puts them
back as they were at the snapshot: an evaluator's line appended after it was there twice, with a
restart that said "verified" (``tests/programs/corpus/eval_subprocess.py``). A file the child
writes that its command line does not name stays unseen (docs/files.md).

A token is taken as a path when it names a regular file that is there, or a name with a
directory part or a suffix (``out/eval.json``, ``results.txt``) in a directory that is there:
the child may make it. Options' and settings' values (``--out=PATH``, ``out=PATH``) and a
shell's redirections (``>>PATH``) are looked into; the command itself (the first token) is not,
nor are directories: a dataset's folder handed to a reader is not the program's to put back.
"""

from __future__ import annotations

import os
import re
import shlex
import stat as stat_

# The audit events of a process started by exec (multiprocessing's spawn raises none of them).
EVENTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn")
_REDIRECT = re.compile(r"^(?:\d*>>?|&>>?|>\||<)")
_FILE_LIKE = re.compile(r"(?:/|\.[A-Za-z0-9_]{1,10}$)")
_LONGEST = 4096
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def command_paths(event: str, args: tuple) -> list[str]:
    """The paths, absolute, that the command of a process-starting audit ``event`` names."""
    if event == "subprocess.Popen":
        _, argv, cwd, _ = args
    elif event == "os.system":
        argv, cwd = ["sh", "-c", args[0]], None
    elif event in ("os.posix_spawn", "os.exec"):
        argv, cwd = args[1], None
    elif event == "os.spawn":
        argv, cwd = args[2], None
    else:
        return []
    base = os.fsdecode(cwd) if cwd is not None else os.getcwd()
    found = []
    for token in _words(argv):
        path = _as_path(token, base)
        if path is not None:
            found.append(path)
    return found


def _words(argv) -> list[str]:
    """The command's arguments after the command itself. A shell's ``-c`` command line is split
    as the shell would, roughly; another program's ``-c`` (``python -c CODE``) is code, not paths."""
    try:
        argv = [os.fsdecode(arg) for arg in ([argv] if isinstance(argv, (str, bytes)) else argv or ())]
    except TypeError:
        return []
    if not argv:
        return []
    words, shell = [], os.path.basename(argv[0]) in _SHELLS
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "-c":
            line = next(rest, "")
            if shell:
                try:
                    words.extend(shlex.split(line, comments=True)[1:])
                except ValueError:  # an unbalanced quote: not a command line
                    pass
            continue
        words.append(arg)
    return words


def _as_path(token: str, base: str) -> str | None:
    token = _REDIRECT.sub("", token)
    if token.startswith("-") or ("=" in token and not os.path.lexists(os.path.join(base, token))):
        token = token.partition("=")[2]  # an option's value, or a setting's (Hydra's out=results.json)
    if not token or len(token) > _LONGEST or "\n" in token or "\0" in token or "://" in token:
        return None
    path = os.path.normpath(os.path.join(base, os.path.expanduser(token)))
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        st = None
    if st is not None:
        return path if stat_.S_ISREG(st.st_mode) else None
    if _FILE_LIKE.search(token) and os.path.isdir(os.path.dirname(path)):
        return path
    return None
