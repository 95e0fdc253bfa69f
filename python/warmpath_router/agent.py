"""`python -m warmpath_router.agent ARGS`: runs `warmpath-agent ARGS`."""

import sys

from ._launch import exec_binary

if __name__ == "__main__":
    sys.exit(exec_binary("warmpath-agent"))
