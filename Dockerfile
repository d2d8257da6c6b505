# The broker's container image: web server, dispatcher and housekeeping in one (docs/deploy.md).
#
# Needs BuildKit (the default builder of Docker 23 and later; DOCKER_BUILDKIT=1 with Debian's
# docker.io 20.10) for the optional pip secrets below:
#   docker build -t webhook-broker .
# On a network that re-signs TLS with its own CA, or with a private package index:
#   docker build --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt \
#                --secret id=pip_conf,src=$HOME/.config/pip/pip.conf -t webhook-broker .
# Secrets are mounted for one RUN step of the builder stage only: they are in no layer, and the
# builder stage is not part of the image.
#
# BASE_IMAGE: any Debian bookworm with python3 (3.11) and its venv module, used by both stages
# so that the copied virtual environment finds the same interpreter at the same path.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_DEFAULT_TIMEOUT=120
# python3, not python: a Debian base has only python3 (and needs its python3-venv package).
RUN python3 -m venv /opt/venv
WORKDIR /src
# The pinned dependencies first, in a layer of their own that source changes do not rebuild.
COPY requirements.txt requirements-otel.txt ./
RUN --mount=type=secret,id=pip_cert --mount=type=secret,id=pip_conf \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    /opt/venv/bin/pip install -r requirements.txt -r requirements-otel.txt
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY consumers ./consumers
COPY jobs ./jobs
COPY spark_etl ./spark_etl
COPY templates ./templates
COPY static ./static
# The package itself; its build backend (setuptools) is fetched for the build like any package.
RUN --mount=type=secret,id=pip_cert --mount=type=secret,id=pip_conf \
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
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
WORKDIR /var/lib/broker
USER 10001:10001
EXPOSE 8000
# The web server; the same image runs `django-admin dispatch`, `django-admin qcluster` and
# `django-admin migrate` (compose.yaml, deploy/kubernetes/). gunicorn's settings are the broker's
# (broker/gunicorn_conf.py: 4 threads a worker, so that long polls cannot take the server);
# worker processes: WEB_CONCURRENCY (gunicorn reads it; one per core), more options and overrides
# in GUNICORN_CMD_ARGS.
CMD ["gunicorn", "--config", "python:broker.gunicorn_conf", "broker.wsgi", "--bind", "0.0.0.0:8000"]
