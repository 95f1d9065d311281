#!/usr/bin/env bash
# Virtual environments for the other supported interpreters, in which tests/e2e/test_e2e_interpreters.py
# runs the programs that need no torch: .venv-py312 and .venv-py313 in the repository root.
#
#     bash tools/interpreters.sh [VERSION...]        (default: 3.12 3.13)
#
# gpusnap goes in editable with --no-deps, beside its runtime dependencies minus torch and
# cuda-python (read from pyproject.toml), plus numpy for the programs: pip would otherwise take
# a multi-GB CUDA build of torch for these interpreters. A working environment is kept. An
# interpreter that is not found, or an install that fails, is reported and skipped: the tests
# skip that interpreter and say why.
set -uo pipefail
cd "$(dirname "$0")/.."

PIP=(-m pip install --quiet --disable-pip-version-check)

# The interpreter for X.Y: pythonX.Y on PATH, else a pyenv installation of it.
find_python() {
    local candidate
    for candidate in "python$1" "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/"python$1"; do
        if "$candidate" -c '' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

runtime_deps() {
    "$1" - <<'EOF'
import tomllib

with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print(*(d for d in deps if not d.startswith(("torch", "cuda-python"))), "numpy")
EOF
}

# Kept when it imports everything the tests use, and gpusnap from this checkout (-I: not from the
# current directory, which is this checkout whatever the environment installed).
usable() {
    [ -x "$1/bin/python" ] && "$1/bin/python" -I - 2>/dev/null <<EOF
import blosc2, click, numpy, psutil, xxhash, gpusnap, os
assert os.path.realpath(gpusnap.__file__).startswith(os.path.realpath("gpusnap") + os.sep)
EOF
}

make_venv() {
    local version=$1 venv=".venv-py${1/./}" python log
    if usable "$venv"; then
        echo "interpreters: $venv ready"
        return 0
    fi
    if ! python=$(find_python "$version"); then
        echo "interpreters: no python$version found; its tests will be skipped" >&2
        return 0
    fi
    rm -rf "$venv"
    log=$(mktemp)
    # pip's output (with its warning that gpusnap's torch is missing, left out on purpose) only
    # matters when something fails.
    # shellcheck disable=SC2046 - one word per requirement
    if { "$python" -m venv "$venv" &&
        "$venv/bin/python" "${PIP[@]}" $(runtime_deps "$venv/bin/python") &&
        "$venv/bin/python" "${PIP[@]}" --no-deps -e .; } >"$log" 2>&1; then
        echo "interpreters: $venv made from $python"
    else
        tail -n 20 "$log" >&2
        echo "interpreters: setting up $venv failed; its tests will be skipped" >&2
        rm -rf "$venv"
    fi
    rm -f "$log"
}

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.12 3.13)
# Side by side: each waits mostly on the package index and on unpacking wheels.
for version in "${versions[@]}"; do
    make_venv "$version" &
done
wait
