#!/usr/bin/env bash
# The GPU path, checked where a GPU exists (issue 20 item 8), in under 8 minutes: the CUDA
# tests (tests/test_cuda.py, and test_torch.py's CUDA staging tests) and benchmarks/gpu.py
# (a state of several GiB on the GPU saved by ckptio sync/async, torch.save and DCP), whose
# figures go to benchmarks/results/gpu-<date>.json. Arguments go to benchmarks/gpu.py:
#
#     bash scripts/gpu-check.sh [--size 4GiB] [--rounds 3]
#
# Python: $PYTHON if set, else .venv/bin/python if there is one, else a new .venv that also
# sees python3's own packages (a preinstalled CUDA torch), into which ckptio is installed
# with what the check needs (pip install -e '.[test]', plus torch where python3 has none; an
# editable install, since backends are found through its entry points). Offline, give pip a
# wheel directory: PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
end=$((SECONDS + 480))
left() { echo $((end - SECONDS > 1 ? end - SECONDS : 1)); }  # seconds left of the 8 minutes

if [[ -n "${PYTHON:-}" ]]; then
  py=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  py=.venv/bin/python
else
  python3 -m venv .venv
  py=.venv/bin/python
  # python3's site-packages after the venv's own: a torch installed there (with CUDA) is used
  python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
    >"$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer-site.pth"
  timeout "$(left)" "$py" -m pip install -q -e '.[test]'
  "$py" -c 'import torch' 2>/dev/null || timeout "$(left)" "$py" -m pip install -q torch
fi

"$py" -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else
  f"gpu-check: torch {torch.__version__} sees no CUDA device; nothing checked")'
nvidia-smi -L 2>/dev/null || true
timeout "$(left)" "$py" -m pytest tests/test_cuda.py tests/test_torch.py -k cuda -q -rs -p no:cacheprovider
timeout "$(left)" "$py" benchmarks/gpu.py "$@"
