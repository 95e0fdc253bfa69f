"""Finds and runs the binaries the wheel installed."""

import os
import shutil
import sys
import sysconfig


def binary_path(name):
    """The installed `name` binary: the scripts folder of this interpreter's
    environment first (where pip put it, even when that folder is not on the
    PATH), then the PATH."""
    candidates = []
    for scheme in (None, "posix_user"):
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        candidates.append(os.path.join(d, name))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} is not installed beside this Python ({', '.join(candidates)}) nor on the PATH; "
        "reinstall the warmpath-router wheel"
    )


def exec_binary(name, argv=None):
    """Replaces this process with the binary, so that signals (SIGTERM,
    SIGHUP, Ctrl-C) and the exit status are the binary's own."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = binary_path(name)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 127
    os.execv(path, [name] + list(argv))
    return 0  # not reached
