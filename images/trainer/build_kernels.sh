#!/usr/bin/env bash
# Builds causal-conv1d and mamba-ssm wheels whose CUDA extensions hold code for the listed GPU
# architectures only. Both setup.py files append their own fixed -gencode list (sm_75 up to sm_121 under
# CUDA 13) whatever TORCH_CUDA_ARCH_LIST says, and mamba-ssm's selective-scan extension then takes most
# of an hour to compile; for one architecture it takes minutes.
#
#   images/trainer/build_kernels.sh ARCH_LIST WHEEL_DIR [SDIST ...]
#     ARCH_LIST  compute capabilities as in TORCH_CUDA_ARCH_LIST: "9.0" (H100/H200), "8.0;9.0", ...
#     SDIST      the two source archives; without them the pinned versions are downloaded from PyPI
#
# Needs the torch the wheels will run with, nvcc of the same CUDA major version, ninja, setuptools and
# wheel. MAX_JOBS (default: all cores) bounds the parallel compiler processes.
set -euo pipefail
if (( $# < 2 )); then
  echo "usage: $0 ARCH_LIST WHEEL_DIR [SDIST ...]   (e.g. $0 9.0 wheels)" >&2
  exit 2
fi
arch_list=$1 wheel_dir=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if (( $# == 0 )); then
  python3 -m pip download --no-deps --no-binary :all: --no-build-isolation --dest "$work" \
    "causal-conv1d==${CAUSAL_CONV1D_VERSION:-1.7.0}" "mamba-ssm==${MAMBA_SSM_VERSION:-2.3.2.post1}"
  set -- "$work"/*.tar.gz
fi
for sdist in "$@"; do
  tar -xzf "$sdist" -C "$work"
done

mkdir -p "$wheel_dir"
for name in causal_conv1d mamba_ssm; do
  src=$(echo "$work"/${name}-*/)
  if [[ ! -f $src/setup.py ]]; then
    echo "no ${name} source archive among: $*" >&2
    exit 2
  fi
  python3 "$here/narrow_gencode.py" "$src/setup.py" "$arch_list"
  echo "building $(basename "$src") for $arch_list" >&2
  TORCH_CUDA_ARCH_LIST="$arch_list" CAUSAL_CONV1D_FORCE_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    python3 -m pip wheel --no-build-isolation --no-deps --wheel-dir "$wheel_dir" "$src"
done
