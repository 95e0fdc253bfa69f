"""warmpath: cache-aware request routing for LLM inference fleets.

The wheel ships the `warmpath-router` and `warmpath-agent` binaries on the
PATH; this package adds launchers (`python -m warmpath_router.router ...`,
`python -m warmpath_router.agent ...`), a stdlib-only client
(`warmpath_router.client`, streaming included) and `warmpath_router.vllm`,
which prints the agent flags matching a `vllm serve` command line.
"""

from ._launch import binary_path

__all__ = ["binary_path"]
