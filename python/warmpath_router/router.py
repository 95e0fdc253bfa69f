"""`python -m warmpath_router.router ARGS`: runs `warmpath-router ARGS`."""

import sys

from ._launch import exec_binary

if __name__ == "__main__":
    sys.exit(exec_binary("warmpath-router"))
