#!/usr/bin/env bash
# Build machine side of a GPU run: build nlptrain with CUDA, pack what a bare GPU machine lacks, and
# make the datasets, all into bench/gpu/stage/ (git-ignored; copy it to the GPU node with the tree).
#
#   bash bench/gpu/prepare.sh [SHARED_DATA_DIR]      (default ../shared/data beside the checkout)
#
# Environment: GPU_ARCH (90: H100/H200; e.g. 80 for an A100, "80;90" for both) the GPU the stage is
# built for, as SASS only (ARCH-real: no PTX, no second architecture); BUILD_DIR (build-gpu); JOBS
# (nproc); CMAKE_CXX_COMPILER_LAUNCHER and CMAKE_CUDA_COMPILER_LAUNCHER (e.g. ccache) passed to cmake.
# The normal build (CMakeLists.txt) keeps sm_80 and sm_90.
#
# Then on the GPU node, with bench/gpu/stage beside the tree:
#   bash bench/gpu/run.sh                            (see there; writes everything under $OUT)
#
# stage/bin/   nlptrain, test_ops_cuda, test_cuda_bf16 (stripped), run-on-device.sh + device-libs.tar.xz
#              (Open MPI, HDF5, OpenBLAS, oneDNN, Boost; the device has CUDA, cuDNN and NCCL in its
#              PyTorch install)
# stage/data/  gpt2_train.h5   GPT-2 BPE token stream (WikiText-2 test + Tiny Shakespeare), for the
#                              124M benchmark (T=1024) and the small end-to-end runs
#              nsmc_train.h5   NSMC reviews, kcbert-base WordPiece, T=128 (doc_cls), 4096 rows; also
#                              the small RoBERTa's and ELECTRA's (inputs/roberta_small.ini: padded
#                              with [PAD] = 0, its pad_token_id; token types all 0, type_vocab_size 1)
#              ft/doc_cls/     run.sh's finetune section: NSMC train (8000 reviews) and test (500) at
#                              T=128, with the key bench/finetune_speed.sh checks before it reuses data
#              commit.txt      the commit the binaries were built from
# At the end: the size of what travels (bench/gpu/travel_size.py: the tree, each part of the stage, the
# total against the 50 MiB target and the 64 MiB limit); exit 1 when it cannot be sent.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:-../shared/data}
B=${BUILD_DIR:-build-gpu}
S=bench/gpu/stage
command -v nvcc >/dev/null || { echo "prepare: nvcc not found: the GPU run needs a CUDA build" >&2; exit 2; }
for f in "$D/wikitext2/wiki.test.raw" "$D/tinyshakespeare/input.txt" "$D/vocab/gpt2/encoder.json" \
         "$D/nsmc/nsmc_from_raw_train.tsv" "$D/nsmc/nsmc_from_raw_test.tsv" "$D/vocab/kcbert-base/vocab.txt"; do
  [[ -f "$f" ]] || { echo "prepare: missing $f (shared data)" >&2; exit 2; }
done

GPU_ARCH=${GPU_ARCH:-90}
archs=""
for a in ${GPU_ARCH//;/ }; do
  [[ "$a" =~ ^[0-9]+[af]?$ ]] || { echo "prepare: GPU_ARCH=$GPU_ARCH: '$a' is not an architecture like 90 or 80" >&2; exit 2; }
  archs="${archs:+$archs;}$a-real"
done
launch=()
[[ -n "${CMAKE_CXX_COMPILER_LAUNCHER:-}" ]] && launch+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER")
[[ -n "${CMAKE_CUDA_COMPILER_LAUNCHER:-}" ]] && launch+=(-DCMAKE_CUDA_COMPILER_LAUNCHER="$CMAKE_CUDA_COMPILER_LAUNCHER")
# -march=native off: the GPU machine's CPU may lack this machine's instructions.
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DNLPTRAIN_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  "${launch[@]}" >/dev/null
cmake --build "$B" -j"${JOBS:-$(nproc)}" --target nlptrain test_ops_cuda test_cuda_bf16
# pack only what travels: nlptrain and the CUDA op tests (pack_for_device scans BUILD/tests/test_*),
# stripped (symbols and debug sections; the device code is kept)
tmp=$(mktemp -d)
mkdir -p "$tmp/tests"
cp "$B/nlptrain" "$tmp/"
cp "$B/tests/test_ops_cuda" "$B/tests/test_cuda_bf16" "$tmp/tests/"
strip --strip-unneeded "$tmp/nlptrain" "$tmp"/tests/test_*
tools/pack_for_device.sh --tar "$tmp"

rm -rf "$S" && mkdir -p "$S/bin" "$S/data"
cp "$tmp/nlptrain" "$tmp"/tests/test_* "$tmp/run-on-device.sh" "$tmp/device-libs.tar.xz" "$S/bin/"
rm -rf "$tmp"
git rev-parse HEAD > "$S/commit.txt"
git status --porcelain --untracked-files=no | grep -q . && echo "dirty" >> "$S/commit.txt" || true

python3 tools/make_dataset.py --tokenizer gpt2 --vocab-dir "$D/vocab/gpt2" --layout stream \
  --eos-between-files --out "$S/data/gpt2_train.h5" --quiet \
  "$D/wikitext2/wiki.test.raw" "$D/tinyshakespeare/input.txt"
head -n 4097 "$D/nsmc/nsmc_from_raw_train.tsv" > "$S/data/nsmc_4096.tsv"
python3 tools/prep_doc_cls.py --vocab "$D/vocab/kcbert-base/vocab.txt" --input "$S/data/nsmc_4096.tsv" \
  --max-seq-len 128 --out "$S/data/nsmc_train.h5" --quiet
rm -f "$S/data/nsmc_4096.tsv"
# the finetune section's data, made by bench/finetune_speed.sh itself (its defaults: the 8000-review NSMC
# train split, 500 test reviews, T=128), so that its key matches and the device reuses the files
ft=$(mktemp -d)
PREP_ONLY=1 TASKS=doc_cls SHARED="$D" WORK="$ft/work" RES="$ft/res" NLPTRAIN_BIN="$B/nlptrain" \
  bash bench/finetune_speed.sh > "$ft/log" 2>&1 || { cat "$ft/log" >&2; exit 1; }
mkdir -p "$S/data/ft"
mv "$ft/work/data/doc_cls" "$S/data/ft/doc_cls"
rm -rf "$ft"
# gzip every dataset (nlptrain's HDF5 and h5py read them unchanged): the data shrink from 24 MB to
# about 3 MB, small enough to copy with the tree
if command -v h5repack >/dev/null; then
  find "$S/data" -name '*.h5' | while read -r f; do h5repack -f GZIP=4 "$f" "$f.tmp" && mv "$f.tmp" "$f"; done
else
  echo "prepare: h5repack not found (Debian hdf5-tools): the data stay uncompressed" >&2
fi
echo "prepare: built for GPU_ARCH=$GPU_ARCH (CMAKE_CUDA_ARCHITECTURES=$archs) from $(head -1 "$S/commit.txt")"
python3 bench/gpu/travel_size.py --stage "$S"
