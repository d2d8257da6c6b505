# The broker's container image: web server, dispatcher and housekeeping in one (docs/deploy.md).
#
#   docker build -t webhook-broker .
#
# Any builder builds it: BuildKit (buildx) or the legacy builder of a docker CLI without buildx,
# so no `RUN --mount`. What pip needs from the build host instead comes from deploy/pip/, copied
# into the builder stage only (deploy/pip/README.md): ca.crt, a CA bundle for a network that
# re-signs TLS with its own CA, and pip.conf, for a private package index. Neither is in the image:
# the builder stage is not part of it.
#
# BASE_IMAGE: any Debian bookworm with python3 (3.11) and its venv module, used by both stages
# so that the copied virtual environment finds the same interpreter at the same path.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=120
# python3, not python: a Debian base has only python3 (and needs its python3-venv package).
RUN python3 -m venv /opt/venv
WORKDIR /src
# What pip may need from the build host (deploy/pip/README.md); the directory always exists.
COPY deploy/pip/ /pip/
# The pinned dependencies first, in a layer of their own that source changes do not rebuild;
# requirements-examples.txt is the example receiver's (docs/examples/receiver.py, the compose demo).
COPY requirements.txt requirements-otel.txt requirements-examples.txt ./
RUN if [ -s /pip/ca.crt ]; then export PIP_CERT=/pip/ca.crt; fi; \
    if [ -s /pip/pip.conf ]; then export PIP_CONFIG_FILE=/pip/pip.conf; fi; \
    /opt/venv/bin/pip install -r requirements.txt -r requirements-otel.txt \
        -r requirements-examples.txt
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY consumers ./consumers
COPY jobs ./jobs
COPY spark_etl ./spark_etl
COPY templates ./templates
COPY static ./static
# The package itself; its build backend (setuptools) is fetched for the build like any package.
RUN if [ -s /pip/ca.crt ]; then export PIP_CERT=/pip/ca.crt; fi; \
    if [ -s /pip/pip.conf ]; then export PIP_CONFIG_FILE=/pip/pip.conf; fi; \
    /opt/venv/bin/pip install --no-deps . && /opt/venv/bin/pip check

FROM ${BASE_IMAGE} AS runtime
# A user of its own, with a fixed numeric id: Kubernetes' runAsNonRoot can only verify a
# numeric USER. /var/lib/broker is where the broker writes (payload files under payloads/).
RUN groupadd --gid 10001 broker \
    && useradd --uid 10001 --gid broker --home-dir /var/lib/broker --no-create-home \
        --no-log-init --shell /usr/sbin/nologin broker \
    && install -d -o broker -g broker -m 0750 /var/lib/broker \
    && install -d -o broker -g broker -m 0700 /var/lib/broker/payloads
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=broker.settings \
    BROKER_LOG_FORMAT=json \
    DJANGO_STATIC_ROOT=/opt/broker/static
# Static files are part of the image (WhiteNoise serves them), outside the data directory so a
# volume mounted there cannot hide them.
RUN django-admin collectstatic --noinput --verbosity 0
# The example receiver, which verifies each webhook's signature (standardwebhooks is in the venv),
# and the publisher of compose.yaml's `demo` profile: `python3 /opt/broker/examples/receiver.py`.
COPY docs/examples/receiver.py docs/examples/demo_publisher.py /opt/broker/examples/
WORKDIR /var/lib/broker
USER 10001:10001
EXPOSE 8000
# The web server; the same image runs `django-admin dispatch`, `django-admin qcluster` and
# `django-admin migrate` (compose.yaml, deploy/kubernetes/). gunicorn's settings are the broker's
# (broker/gunicorn_conf.py: 4 threads a worker, so that long polls cannot take the server);
# worker processes: WEB_CONCURRENCY (gunicorn reads it; one per core), more options and overrides
# in GUNICORN_CMD_ARGS.
CMD ["gunicorn", "--config", "python:broker.gunicorn_conf", "broker.wsgi", "--bind", "0.0.0.0:8000"]
