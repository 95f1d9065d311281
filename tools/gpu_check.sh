#!/usr/bin/env bash
# The GPU check: what a GPU machine must tell gpusnap, in one run of under 7 minutes
# (docs/gpu.md). Each step runs under its own `timeout`, so a step that hangs costs only its
# budget; the budgets add up to 410 s.
#
#   bash tools/gpu_check.sh [--dry-run] [--only STEP,...] [OUTDIR]
#
# OUTDIR (default: $OUT, the device machine's output folder; in a dry run, a new temporary
# folder) gets at most 7 files: summary.txt (the plan, each step's status and time, then every
# verdict line of the others), env.txt, probes.txt, tests.txt, drills.txt, fingerprint.txt,
# bench.txt. --only reruns some steps (a rerun of what failed). --dry-run, on a machine without
# a GPU, runs every step it can against the fake GPU (GPUSNAP_DEVICE=fake) and prints the plan:
# tests/device/test_gpu_check.py runs it, so the script is known to work before a GPU is spent on it.
#
# Wheels. The GPU machine has Python 3.12, torch, cuda-bindings, cuda-core, CuPy, NVRTC, numpy,
# psutil, xxhash, click, msgpack, httpx, rich, threadpoolctl, safetensors, pytest, pytest-xdist
# and pytest-timeout, and no network. It lacks blosc2 and the two of blosc2's imports it does
# not have: blosc2 4.14.1, ndindex 1.10.1, numexpr 2.14.2. Fetch them here, into the ignored
# .whl/ folder at the top of the tree, which the device run carries (carry: [".whl"]):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl blosc2==4.14.1 ndindex==1.10.1 numexpr==2.14.2
#
# The install step puts them in /tmp/site, and gpusnap runs from this tree (PYTHONPATH); nothing
# is installed system-wide. Set GPUSNAP_COMMIT=$(git rev-parse HEAD) in the run's command: the
# copy of the tree on the device machine has no git history.

set -u
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
DRY=0
ONLY=""
OUTDIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --only) ONLY=",$2,"; shift ;;
        -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) OUTDIR=$1 ;;
    esac
    shift
done
if [ -z "$OUTDIR" ]; then
    if [ "$DRY" = 1 ]; then OUTDIR=$(mktemp -d /tmp/gpu-check-out.XXXXXX); else OUTDIR=${OUT:?give an output folder, or set OUT}; fi
fi
mkdir -p "$OUTDIR"
SCRATCH=$(mktemp -d /tmp/gpu-check.XXXXXX)
SUMMARY=$OUTDIR/summary.txt
export PYTHONUNBUFFERED=1
export GPUSNAP_COMMIT=${GPUSNAP_COMMIT:-$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
if [ "$DRY" = 1 ]; then export GPUSNAP_DEVICE=fake; fi

# name|budget in seconds|what it does: the plan (the commands are at the end)
PLAN="install|20|the wheels of .whl/ into /tmp/site
env|20|GPU, driver, CUDA, torch, cuda-bindings, cuda-core, CuPy and NVRTC versions, the commit
probes|40|do-not-fork flags, orphaned pages, stream race, address range, managed ordinal, torch's allocator, first address, kernel
tests|110|the gpu-marked tests but the drills: 4 workers, --timeout 100 --maxfail 10 (beside the drills)
drills|110|cnn, gpt, cuda-python, cupy, cpu-restore: snapshot at a random step, kill -9, restart, compare bytes (beside the tests)
fingerprint|35|tools/bench_fingerprint.py at 2 GiB: GB/s against the device's copy bandwidth, agreement with NumPy
bench|185|tools/bench_gpu.py after a disk and memory preflight: stall, restart and 90% frozen at 1 GB; stall and restart at 8 GB"

budget() { echo "$PLAN" | awk -F'|' -v n="$1" '$1 == n {print $2}'; }
wanted() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }

{
    echo "# gpu_check $(date -Is) commit $GPUSNAP_COMMIT$([ "$DRY" = 1 ] && echo ', DRY RUN on the fake GPU')"
    echo "# output: $OUTDIR; scratch: $SCRATCH"
    longest=$(echo "$PLAN" | awk -F'|' '{t += $2} $1 == "tests" {a = $2} $1 == "drills" {b = $2} END {print t - (a < b ? a : b)}')
    echo "plan (s; tests and drills run side by side, so the run takes at most $longest s):"
    echo "$PLAN" | while IFS='|' read -r name secs what; do
        printf '  %-12s %4s s  %s%s\n' "$name" "$secs" "$what" "$(wanted "$name" || echo '  [not in --only]')"
    done
} | tee "$SUMMARY"

# Runs step $1 (output to file $2, the command after) under its budget; the step's processes carry
# GPU_CHECK_STEP in their environment, so those that outlive a timeout (gpusnap runs its
# programs in sessions of their own) are found and ended, and nothing else is.
step() {
    local name=$1 file=$2
    shift 2
    wanted "$name" || return 0
    local secs started rc
    secs=$(budget "$name")
    started=$(date +%s)
    GPU_CHECK_STEP=$name timeout --kill-after=5 "$secs" "$@" >"$file" 2>&1
    rc=$?
    for proc in /proc/[0-9]*; do
        if { tr '\0' '\n' <"$proc/environ" | grep -qx "GPU_CHECK_STEP=$name"; } 2>/dev/null; then kill -9 "${proc#/proc/}" 2>/dev/null; fi
    done
    case $rc in
        0) status=ok ;;
        124|137) status="TIMED OUT after $secs s" ;;
        *) status="FAILED (exit $rc)" ;;
    esac
    echo "step $name: $status [$(( $(date +%s) - started )) s] -> ${file##*/}" | tee -a "$SUMMARY"
}

install_wheels() {
    local wheels=(.whl/*.whl)
    if [ ! -e "${wheels[0]}" ]; then
        echo "no wheels in .whl/: fetch them (this script's header) before the GPU run"
        [ "$DRY" = 1 ]
        return
    fi
    printf '%s\n' "${wheels[@]}"
    for need in blosc2 ndindex numexpr; do
        ls .whl/"$need"-*.whl >/dev/null 2>&1 || { echo "missing: $need"; return 1; }
    done
    if [ "$DRY" = 1 ]; then
        echo "dry run: the wheels are there (they are for Python 3.12: installed on the GPU machine only)"
        return 0
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}" &&
        "$PY" -c "import blosc2; print('blosc2', blosc2.__version__, 'imports')"
}

if [ "$DRY" = 0 ]; then export PYTHONPATH=/tmp/site:$PYTHONPATH; fi
FAKE=$([ "$DRY" = 1 ] && echo --fake)
GPU_TESTS="tests/device/test_device_backend.py tests/device/test_device_registry.py tests/e2e/test_e2e_device.py tests/e2e/test_e2e_core.py tests/e2e/test_e2e_cuda.py"
DRILL_TESTS="not test_program_restarts_to_the_same_bytes and not test_a_gpu_snapshot_restores_onto_the_cpu and not test_a_cupy_program"
export BENCH="--snapshots 2 --repeats 1 --dir $SCRATCH/bench --out $SCRATCH/bench-report.txt"
bench() {  # the frozen part once, at the small size: its ratio does not depend on the size
    "$PY" tools/bench_gpu.py "$@" $BENCH --sizes 1 --parts stall,restart,frozen
    local small=$?
    "$PY" tools/bench_gpu.py "$@" $BENCH --sizes 8 --parts stall,restart && return $small
}
export -f bench

export DRY PY SCRATCH
export -f install_wheels
step install "$SCRATCH/install.txt" bash -c install_wheels
if [ -e "$SCRATCH/install.txt" ]; then sed 's/^/  /' "$SCRATCH/install.txt" >>"$SUMMARY"; fi
step env "$OUTDIR/env.txt" "$PY" tools/gpu_probe.py env $FAKE
step probes "$OUTDIR/probes.txt" "$PY" tools/gpu_probe.py probes $FAKE
if [ "$DRY" = 1 ]; then
    step tests "$OUTDIR/tests.txt" "$PY" -m pytest -q -p no:cacheprovider --collect-only -m gpu $GPU_TESTS -k "$DRILL_TESTS" &
    step drills "$OUTDIR/drills.txt" "$PY" tools/gpu_drills.py --dry-run &
else
    step tests "$OUTDIR/tests.txt" "$PY" -m pytest -q -rfE -p no:cacheprovider --basetemp "$SCRATCH/pytest" -n 4 \
        --timeout 100 --maxfail 10 -m gpu $GPU_TESTS -k "$DRILL_TESTS" &
    step drills "$OUTDIR/drills.txt" "$PY" tools/gpu_drills.py &
fi
wait
if [ "$DRY" = 1 ]; then
    step fingerprint "$OUTDIR/fingerprint.txt" "$PY" tools/bench_fingerprint.py --backend fake --gib 0.01 --chunk-mib 1 --repeat 1
    step bench "$OUTDIR/bench.txt" bash -c 'bench --dry-run'
else
    step fingerprint "$OUTDIR/fingerprint.txt" "$PY" tools/bench_fingerprint.py --gib 2 --repeat 3
    step bench "$OUTDIR/bench.txt" bash -c bench
fi

{
    echo "verdicts:"
    grep -h -E '^(probe |drill |fingerprint |agrees |  goal |  90% frozen|  restart:|  gpusnap snapshot|## |[0-9]+ (passed|failed)|.*(passed|failed|error).* in [0-9.]+s)' \
        "$OUTDIR"/env.txt "$OUTDIR"/probes.txt "$OUTDIR"/tests.txt "$OUTDIR"/drills.txt "$OUTDIR"/fingerprint.txt \
        "$OUTDIR"/bench.txt 2>/dev/null
    grep -h -E '^(commit|gpu \(nvidia-smi\)|CUDA driver API|torch|cuda-bindings|cuda-core|cupy-cuda13x|NVRTC): ' "$OUTDIR"/env.txt 2>/dev/null
} | tee -a "$SUMMARY"
rm -rf "$SCRATCH"
! grep -q -E '^step .*: (FAILED|TIMED OUT)' "$SUMMARY"
