#!/usr/bin/env bash
# The quickstart corpus: nlptrain's own C++ sources, headers, scripts and docs, as byte tokens.
# Writes runs/quickstart/train.h5 and runs/quickstart/eval.h5 (last 5% of the byte stream).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs/quickstart
mapfile -t files < <(find src kernels tools tests inputs jobscripts -type f \
  \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.py' -o -name '*.sh' -o -name '*.ini' \) | sort)
files+=(README.md CMakeLists.txt)
python3 tools/make_dataset.py --tokenizer byte --layout stream --val-fraction 0.05 \
  --out runs/quickstart/train.h5 --val-out runs/quickstart/eval.h5 "${files[@]}"
