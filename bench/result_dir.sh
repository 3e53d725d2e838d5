# Sourced by the bench scripts: the default folder of a measurement's results,
#   bench/results/KIND-DATE-HARDWARE-COMMIT
# (bench/results/README.md: DATE is the UTC date, HARDWARE names the CPU or GPU that ran it, COMMIT is
# the checkout's short commit, with -dirty when tracked files differ from it).
#
#   . bench/result_dir.sh
#   RES=${RES:-$(result_dir finetune-speed "$DEVICE")}    # DEVICE cpu (default) or cuda

# result_hardware [cpu|cuda]: h200, h100, ... for a GPU (nvidia-smi's name without "NVIDIA"); for a
# CPU xeon-amx (a Xeon with AMX-BF16), xeon, epyc-zen2 / -zen3 / -zen4 / -zen5 (AMD's family and
# model), or the model name's first word; unknown when nothing says.
result_hardware() {
  if [ "${1:-cpu}" = cuda ]; then
    local gpu
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
          sed -E 's/^NVIDIA +//' | awk '{print tolower($1)}' | tr -cd 'a-z0-9-' || true)
    echo "${gpu:-unknown}"
    return
  fi
  local info model family cpu_model
  info=$(LC_ALL=C lscpu 2>/dev/null || true)
  model=$(sed -n 's/^Model name: *//p' <<<"$info" | head -1)
  family=$(sed -n 's/^CPU family: *//p' <<<"$info" | head -1)
  cpu_model=$(sed -n 's/^Model: *//p' <<<"$info" | head -1)
  case "$model" in
    *Xeon*)
      if grep -qm1 '^flags.* amx_bf16' /proc/cpuinfo 2>/dev/null; then echo xeon-amx; else echo xeon; fi ;;
    *EPYC*)
      case "$family" in
        23) if (( ${cpu_model:-0} >= 48 )); then echo epyc-zen2; else echo epyc-zen1; fi ;;
        25) if (( ${cpu_model:-0} < 16 || (${cpu_model:-0} >= 32 && ${cpu_model:-0} < 48) )); then
              echo epyc-zen3
            else
              echo epyc-zen4
            fi ;;
        26) echo epyc-zen5 ;;
        *) echo epyc ;;
      esac ;;
    "") echo unknown ;;
    *) awk '{print tolower($1)}' <<<"$model" | tr -cd 'a-z0-9-' ;;
  esac
}

# result_commit: the short commit of the checkout, -dirty when tracked files differ; unknown outside git
result_commit() {
  local c
  c=$(git rev-parse --short=7 HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then c="$c-dirty"; fi
  echo "$c"
}

# result_dir KIND [cpu|cuda]: bench/results/KIND-DATE-HARDWARE-COMMIT (relative to the repository root)
result_dir() {
  echo "bench/results/$1-$(date -u +%Y%m%d)-$(result_hardware "${2:-cpu}")-$(result_commit)"
}
