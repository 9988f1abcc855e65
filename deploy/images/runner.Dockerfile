# syntax=docker/dockerfile:1
# The runner's image: the runner and the base layer of every job (torch with CUDA, the
# trainyard SDK). Build from the repository root:
#
#   docker build -f deploy/images/runner.Dockerfile -t trainyard-runner:local .
#
# Dependencies come only from deploy/requirements/runner.txt, every file checked against its
# sha256. Its torch (the pin of pyproject.toml) is PyPI's Linux x86_64 wheel, the CUDA 13.0
# build: the CUDA libraries come inside the nvidia-* wheels, the host needs the NVIDIA
# driver (580 or later) and the NVIDIA Container Toolkit. The same image runs on a machine
# without GPUs (TRAINYARD_RUNNER_VIRTUAL_GPUS); for an older driver lock another CUDA build
# (TORCH_BACKEND=cu128 deploy/requirements/compile.sh, see deploy/README.md).
#
# The image's user is unprivileged. Compose and the Kubernetes DaemonSet start the runner
# as root with only the capabilities it needs, so that it runs each job as a uid of its own
# (services/runner/sandbox.py); started as this user it runs jobs as itself, and says so.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/trainyard
ENV PATH=/opt/trainyard/bin:$PATH
WORKDIR /src
COPY deploy/requirements/build.txt deploy/requirements/runner.txt deploy/requirements/
RUN pip install --no-cache-dir --require-hashes --only-binary :all: -r deploy/requirements/build.txt \
    && pip install --no-cache-dir --require-hashes --only-binary :all: --no-deps \
        -r deploy/requirements/runner.txt
COPY pyproject.toml README.md LICENSE ./
COPY shared ./shared
COPY services ./services
COPY client ./client
COPY deploy ./deploy
# Links to the three folders above: the wheel installs them under this one name.
COPY trainyard_platform ./trainyard_platform
# Two distributions: the client (client/, package trainyard) that the platform depends on,
# then the platform itself.
RUN pip install --no-cache-dir --no-deps --no-build-isolation ./client . \
    && pip check \
    && python -c "import trainyard_platform.services.runner.__main__, trainyard.sdk"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/trainyard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TRAINYARD_RUNNER_HOST=0.0.0.0 \
    TRAINYARD_RUNNER_PORT=8000 \
    TRAINYARD_RUNNER_WORK_DIR=/var/lib/trainyard/runner
# git fetches a job's code named by a git repository (https or git://, services/runner/
# git_remote.py; its https pin needs git 2.37 or later: bookworm's is 2.39). Not pinned to
# a Debian revision: the archive keeps only a release's latest, so a pin would break the
# build at its next security update; the base image's tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && git --version
RUN groupadd --system --gid 10001 trainyard \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/trainyard --create-home trainyard \
    && mkdir -p /var/lib/trainyard/runner \
    && chown 10001:10001 /var/lib/trainyard/runner
COPY --from=build /opt/trainyard /opt/trainyard
USER 10001:10001
WORKDIR /home/trainyard
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["python", "-m", "trainyard_platform.services.runner"]
