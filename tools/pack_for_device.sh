#!/usr/bin/env bash
# Pack the shared libraries that nlptrain and the test binaries need on a machine WITHOUT MPI or
# HDF5 (a GPU node with the CUDA 13 toolkit, cuDNN/NCCL in its PyTorch install, and no network).
#
#   tools/pack_for_device.sh [--tar] [BUILD_DIR]        (BUILD_DIR defaults to build)
#
# Writes
#   BUILD_DIR/device-libs/            every library the binaries resolve through ldd here, except the
#                                     C/C++ runtime (libc, libm, libstdc++, libgcc_s, ld-linux, ...)
#                                     and the CUDA libraries the GPU node has (libcuda, libcudart,
#                                     libcublas*, libcudnn*, libnccl*, ...);
#   BUILD_DIR/device-libs/openmpi/    Open MPI's plugins (those that need no InfiniBand/UCX/OFI/PSM
#                                     stack), their dependencies, help files and MCA parameter file,
#                                     for a relocated Open MPI;
#   BUILD_DIR/run-on-device.sh        the wrapper: LD_LIBRARY_PATH (packed libraries first, then the
#                                     device's CUDA libraries), OPAL_* relocation, then runs "$@";
#   BUILD_DIR/device-libs.tar.xz      with --tar: the same folder compressed, for a copy to the node
#                                     (libopenblas alone is ~36 MiB uncompressed); the wrapper unpacks
#                                     it next to itself when device-libs/ is missing.
#
# On the GPU node, run the binaries WITHOUT mpirun for one rank (an Open MPI "singleton": MPI_Init in a
# process not started by mpirun gives a one-rank MPI_COMM_WORLD; the wrapper selects Open MPI's isolated
# singleton mode so that no orted daemon is needed), or through the packed mpirun for several ranks
# sharing the one GPU (comm.gpu = staged):
#   build/run-on-device.sh mpirun -np 2 --oversubscribe build/nlptrain ... --comm.gpu=staged
#   build/run-on-device.sh build/nlptrain --version
#   build/run-on-device.sh build/tests/test_ops_cuda
#   build/run-on-device.sh --check build/nlptrain      (ldd with the packed paths: lists "not found")
set -euo pipefail

tar=0
if [[ "${1:-}" == "--tar" ]]; then
  tar=1
  shift
fi
build=${1:-build}
[[ -d "$build" ]] || { echo "pack_for_device: no build directory '$build'" >&2; exit 2; }
build=$(cd "$build" && pwd)
out="$build/device-libs"

# ---- the binaries ---------------------------------------------------------------------------------
bins=()
[[ -x "$build/nlptrain" ]] && bins+=("$build/nlptrain")
for t in "$build"/tests/test_*; do
  [[ -f "$t" && -x "$t" ]] && head -c 4 "$t" | grep -q ELF && bins+=("$t")
done
((${#bins[@]})) || { echo "pack_for_device: no nlptrain or tests/test_* binaries in $build" >&2; exit 2; }

# Libraries never copied: the C/C++ runtime of the GPU node and the CUDA libraries it has.
skip_re='^(linux-vdso|linux-gate|ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libnsl|libmvec|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libnvrtc.*|libnvJitLink|libcufft|libcurand|libcusolver|libcusparse|libnvidia-.*)\.so'
# Open MPI plugins that need a network stack the GPU node does not have are left out.
plugin_skip_re='lib(ucp|ucs|uct|fabric|psm_infinipath|psm2|ibverbs|rdmacm|ucm)\.so'
# OpenSHMEM's plugins (and through them liboshmem) are never loaded: nlptrain is an MPI program only.
oshmem_skip_re='liboshmem\.so'

rm -rf "$out" "$build/device-libs.tar.xz"  # no stale archive: --tar writes a fresh one
mkdir -p "$out"
declare -A copied=()

# copy_deps FILE: copy every non-skipped library FILE resolves (ldd gives the transitive closure)
copy_deps() {
  local line name path
  while IFS= read -r line; do
    if [[ "$line" =~ ^[[:space:]]*([^[:space:]]+)[[:space:]]+=\>[[:space:]]+not[[:space:]]found ]]; then
      echo "pack_for_device: warning: $1 needs ${BASH_REMATCH[1]}, not found here" >&2
      continue
    fi
    [[ "$line" =~ ^[[:space:]]*([^[:space:]]+)[[:space:]]+=\>[[:space:]]+([^[:space:]]+) ]] || continue
    name=${BASH_REMATCH[1]}
    path=${BASH_REMATCH[2]}
    [[ "$name" =~ $skip_re ]] && continue
    [[ -n "${copied[$name]:-}" ]] && continue
    cp -L "$path" "$out/$name"
    copied[$name]=$path
  done < <(ldd "$1" 2>/dev/null || true)
}

for b in "${bins[@]}"; do copy_deps "$b"; done

# ---- Open MPI, relocated --------------------------------------------------------------------------
if [[ -n "${copied[libmpi.so.40]:-}" ]]; then
  if command -v ompi_info >/dev/null 2>&1; then
    pkglibdir=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
    pkgdatadir=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
    sysconfdir=$(ompi_info --path sysconfdir --parsable 2>/dev/null | sed -n 's/^path:sysconfdir://p')
  fi
  pkglibdir=${pkglibdir:-/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3}
  pkgdatadir=${pkgdatadir:-/usr/share/openmpi}
  sysconfdir=${sysconfdir:-/etc/openmpi}
  mkdir -p "$out/openmpi/plugins" "$out/openmpi/share" "$out/openmpi/etc"
  nplug=0
  nskip=0
  noshmem=0
  for so in "$pkglibdir"/mca_*.so "$pkglibdir"/libompi_dbg_msgq.so; do
    [[ -f "$so" ]] || continue
    deps=$(ldd "$so" 2>/dev/null || true)  # (not piped into grep -q: SIGPIPE + pipefail)
    if grep -Eq "$plugin_skip_re" <<<"$deps"; then
      nskip=$((nskip + 1))
      continue
    fi
    if grep -Eq "$oshmem_skip_re" <<<"$deps"; then
      noshmem=$((noshmem + 1))
      continue
    fi
    cp -L "$so" "$out/openmpi/plugins/"
    copy_deps "$so"
    nplug=$((nplug + 1))
  done
  # mpirun (Open MPI 4: orterun) and orted, for several ranks on the one GPU (comm.gpu = staged):
  # started through the wrapper, they find the packed plugins through the OPAL_* variables.
  mkdir -p "$out/openmpi/bin"
  for exe in orterun orted; do
    p=$(command -v "$exe" 2>/dev/null || true)
    [[ -n "$p" ]] || continue
    cp -L "$p" "$out/openmpi/bin/$exe"
    copy_deps "$p"
  done
  [[ -x "$out/openmpi/bin/orterun" ]] && ln -sf orterun "$out/openmpi/bin/mpirun"
  [[ -d "$pkgdatadir" ]] && cp -rL "$pkgdatadir/." "$out/openmpi/share/"
  [[ -d "$sysconfdir" ]] && cp -L "$sysconfdir"/*.conf "$out/openmpi/etc/" 2>/dev/null || true
  echo "pack_for_device: Open MPI: $nplug plugins packed, $nskip left out (network stacks), $noshmem (OpenSHMEM)"
fi

# ---- the wrapper ----------------------------------------------------------------------------------
cat > "$build/run-on-device.sh" <<'WRAP'
#!/usr/bin/env bash
# Run a command with the libraries packed by tools/pack_for_device.sh (see there).
#   run-on-device.sh [--check] COMMAND [ARGS...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
libs="$here/device-libs"
# unpacked into a private folder, then renamed into place: a second caller started meanwhile (the GPU
# script runs several at once) never sees a half-unpacked device-libs/, and at most one rename wins
if [[ ! -d "$libs" && -f "$here/device-libs.tar.xz" ]]; then
  tmp=$(mktemp -d "$here/.device-libs.XXXXXX")
  tar -xJf "$here/device-libs.tar.xz" -C "$tmp"
  mv -T "$tmp/device-libs" "$libs" 2>/dev/null || [[ -d "$libs" ]]
  rm -rf "$tmp"
fi
[[ -d "$libs" ]] || { echo "run-on-device: no $libs (run tools/pack_for_device.sh first)" >&2; exit 2; }

# The GPU node's CUDA 13 libraries: the toolkit, then the NVIDIA wheels of its PyTorch install.
cuda_path=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
  [[ -d "$d" ]] && cuda_path="$cuda_path:$d"
done
export LD_LIBRARY_PATH="$libs$cuda_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Relocated Open MPI: plugins, help files and parameter file from the packed copy.
if [[ -d "$libs/openmpi" ]]; then
  export OPAL_PREFIX="$libs/openmpi"
  export OPAL_PKGLIBDIR="$libs/openmpi/plugins"
  export OPAL_PKGDATADIR="$libs/openmpi/share"
  export OPAL_SYSCONFDIR="$libs/openmpi/etc"
  export OMPI_MCA_mca_base_component_path="$libs/openmpi/plugins"
  # Singleton without mpirun: no orted to start, shared memory and self transports only.
  export OMPI_MCA_ess_singleton_isolated="${OMPI_MCA_ess_singleton_isolated:-1}"
  export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
  export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
  export OMPI_MCA_mca_base_component_show_load_errors="${OMPI_MCA_mca_base_component_show_load_errors:-0}"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # the packed mpirun first: run-on-device.sh mpirun -np 2 ... (ranks inherit this environment)
  export PATH="$libs/openmpi/bin:$PATH"
  # hwloc's optional plugins (GL, OpenCL, PCI, XML) are not packed: load none.
  export HWLOC_PLUGINS_PATH="${HWLOC_PLUGINS_PATH:-$libs/hwloc-plugins}"
fi

if [[ "${1:-}" == "--check" ]]; then
  shift
  status=0
  for f in "$@"; do
    if ! deps=$(ldd "$f" 2>/dev/null); then
      echo "$f: not a dynamic executable, skipped"
      continue
    fi
    missing=$(grep 'not found' <<<"$deps" || true)
    if [[ -n "$missing" ]]; then
      echo "$f: unresolved:" >&2
      echo "$missing" >&2
      status=1
    else
      echo "$f: every library resolves"
    fi
  done
  exit $status
fi
exec "$@"
WRAP
chmod +x "$build/run-on-device.sh"

size=$(du -sh "$out" | cut -f1)
echo "pack_for_device: ${#copied[@]} libraries in $out ($size) for ${#bins[@]} binaries; wrapper $build/run-on-device.sh"
if ((tar)); then
  XZ_OPT=${XZ_OPT:--9e} tar -cJf "$build/device-libs.tar.xz" -C "$build" device-libs  # xz -9e: it travels
  echo "pack_for_device: $(du -sh "$build/device-libs.tar.xz" | cut -f1) in $build/device-libs.tar.xz"
fi
