#!/bin/sh
# Regenerates the image lock files from pyproject.toml (the platform) and client/pyproject.toml
# (the client it depends on, through client.in), with a sha256 for every file, for
# CPython 3.11 on x86_64 Linux (the images' platform); wheels only, nothing built from source.
#
#   deploy/requirements/compile.sh                 # from the repository root, uv on PATH
#   TORCH_BACKEND=cu128 deploy/requirements/compile.sh
#
# services.txt  the four services: everything but torch (services-overrides.txt)
# runner.txt    the runner and the jobs' base layer: torch from PyPI, whose Linux x86_64
#               wheels of torch 2.13.0 are the CUDA 13.0 build (NVIDIA driver 580 or later);
#               TORCH_BACKEND=cu128 (or cu126, ...) locks the build of that CUDA from
#               https://download.pytorch.org/whl/<backend> instead, for older drivers
# build.txt     the build backend the images install the project with
# compiler.txt  mypyc, with which the services' image compiles the scheduler's policy
set -eu
uv=${UV:-uv}
common="--no-emit-package trainyard --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 --only-binary :all: --emit-index-url --custom-compile-command deploy/requirements/compile.sh"
cd "$(dirname "$0")/../.."
# shellcheck disable=SC2086
"$uv" pip compile pyproject.toml deploy/requirements/client.in $common --override deploy/requirements/services-overrides.txt \
    -o deploy/requirements/services.txt
if [ -n "${TORCH_BACKEND:-}" ]; then
    # shellcheck disable=SC2086
    "$uv" pip compile pyproject.toml deploy/requirements/client.in $common --torch-backend "$TORCH_BACKEND" \
        -o deploy/requirements/runner.txt
else
    # shellcheck disable=SC2086
    "$uv" pip compile pyproject.toml deploy/requirements/client.in $common -o deploy/requirements/runner.txt
fi
# shellcheck disable=SC2086
"$uv" pip compile deploy/requirements/build.in $common -o deploy/requirements/build.txt
# shellcheck disable=SC2086
"$uv" pip compile deploy/requirements/compiler.in $common -o deploy/requirements/compiler.txt
