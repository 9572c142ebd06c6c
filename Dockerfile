# nomad-runner-controller as a container: `docker build -t nomad-runner-controller .`
#
# Two stages on the same official slim Python image: the first installs the
# package into a virtualenv, the second copies only that virtualenv. No
# compiler, no pip cache and no source tree end up in the final image.
# The package and every dependency ship as pure-Python or manylinux wheels, so
# nothing is compiled even in the build stage.
#
# Settings are environment variables (`docker run ... nomad-runner-controller config`
# prints them all); deploy/nomad/ runs this image in Nomad.

# The Python the test suite runs on; the same image for both stages, so the
# virtualenv's interpreter links stay valid when it is copied.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/nrc
WORKDIR /src
# pyproject.toml names README.md as the package's long description.
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY nomadsim ./nomadsim
# pip byte-compiles what it installs, so the read-only image never writes .pyc.
RUN /opt/nrc/bin/pip install .

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
# Bump with pyproject.toml's version (tests/deploy checks that they are equal).
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="nomad-runner-controller" \
      org.opencontainers.image.description="Keeps warm pools of sandbox runners on HashiCorp Nomad and hands them out through a Poseidon-compatible HTTP API" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

RUN groupadd --system --gid 10001 nrc \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin nrc
COPY --from=build /opt/nrc /opt/nrc

ENV PATH=/opt/nrc/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NRC_API_HOST=0.0.0.0 \
    NRC_LOG_FORMAT=json

# Numeric, so that orchestrators can verify it is not root.
USER 10001:10001
EXPOSE 7200

# Liveness through the API's /healthz, with the interpreter the image already
# has. It asks the address the API listens on (loopback when that is all
# interfaces) and NRC_API_PORT, so it follows both settings.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; h = os.environ.get('NRC_API_HOST') or '127.0.0.1'; h = '127.0.0.1' if h in ('0.0.0.0', '::') else h; h = '[' + h + ']' if ':' in h else h; urllib.request.urlopen('http://%s:%s/healthz' % (h, os.environ.get('NRC_API_PORT') or '7200'), timeout=4)"]

ENTRYPOINT ["nomad-runner-controller"]
CMD ["run"]
