# syntax=docker/dockerfile:1
# The image of the four services (submission, scheduler, registry, billing); the command picks
# one: python -m trainyard_platform.services.<name>. No torch in it: no service imports it (the runner image
# has it). Build from the repository root:
#
#   docker build -f deploy/images/services.Dockerfile -t trainyard-services:local .
#
# Dependencies come only from deploy/requirements/services.txt, every file checked against
# its sha256 (regenerate it with deploy/requirements/compile.sh). The project itself is
# installed without its dependencies on top: the client distribution (client/), then the
# platform.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
# The build stage: the same Python on the full Debian image, which has the C compiler the
# scheduler's compiled policy needs (nothing of it reaches the image: only /opt/trainyard).
ARG BUILD_IMAGE=python:3.11.13-bookworm

FROM ${BUILD_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/trainyard
ENV PATH=/opt/trainyard/bin:$PATH
WORKDIR /src
COPY deploy/requirements/build.txt deploy/requirements/services.txt deploy/requirements/
RUN pip install --no-cache-dir --require-hashes --only-binary :all: -r deploy/requirements/build.txt \
    && pip install --no-cache-dir --require-hashes --only-binary :all: --no-deps \
        -r deploy/requirements/services.txt
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
    && python -c "import trainyard_platform.services.submission.__main__, trainyard_platform.services.scheduler.__main__, trainyard_platform.services.registry.__main__, trainyard_platform.services.billing.__main__"
# The scheduler's policy compiled with mypyc, in place in the installed package (about a
# quarter less CPU a pass: BENCHMARKS.md), by a build-only environment of its own; the
# scheduler logs at start which it runs ("placement policy compiled").
COPY deploy/requirements/compiler.txt deploy/requirements/
RUN python -m venv /opt/compiler \
    && /opt/compiler/bin/pip install --no-cache-dir --require-hashes --only-binary :all: \
        -r deploy/requirements/compiler.txt \
    && python -m trainyard_platform.services.scheduler.compiled --with /opt/compiler/bin/python \
    && python -c "from trainyard_platform.services.scheduler.compiled import is_compiled; assert is_compiled()"

FROM ${PYTHON_IMAGE}
# In a container every service listens on all interfaces, port 8000 (outside one the
# defaults are loopback and a port per service).
ENV PATH=/opt/trainyard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TRAINYARD_SUBMISSION_HOST=0.0.0.0 \
    TRAINYARD_SUBMISSION_PORT=8000 \
    TRAINYARD_SCHEDULER_HOST=0.0.0.0 \
    TRAINYARD_SCHEDULER_PORT=8000 \
    TRAINYARD_REGISTRY_HOST=0.0.0.0 \
    TRAINYARD_REGISTRY_PORT=8000 \
    TRAINYARD_BILLING_HOST=0.0.0.0 \
    TRAINYARD_BILLING_PORT=8000
RUN groupadd --system --gid 10001 trainyard \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/trainyard --create-home trainyard
COPY --from=build /opt/trainyard /opt/trainyard
USER 10001:10001
WORKDIR /home/trainyard
EXPOSE 8000
# Liveness; compose and Kubernetes probe /readyz on top.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["python", "-m", "trainyard_platform.services.submission"]
