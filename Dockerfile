# The compensator's image: every process of the service (store node, API, worker, projector, Kafka
# publisher and ingest, outbox relay, stand-ins, nightly reconciliation) is `compensator <command>`
# in this one image, built by the one composition root from the one configuration.
#
# Two stages: the first builds a virtual environment from requirements.lock (every runtime
# package, transitive ones included, at an exact version) plus the project itself; the second
# copies only that environment onto the same pinned base and runs as an unprivileged user.
# Java and Debian's JDBC driver are in the runtime stage for the nightly Spark reconciliation.
# Secrets are never in the image: the cluster secret, the database's password and the callback
# secrets are files mounted at run time (compose.yaml's secrets, made by deploy/make-secrets), read
# by uid 10001; the nodes keep their data 0700/0600 under /var/lib/compensator (its own 0700).

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/compensator
COPY requirements.lock ./
RUN /opt/compensator/bin/pip install --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY api ./api
COPY compensator ./compensator
COPY delay ./delay
COPY handlers ./handlers
COPY ledger ./ledger
COPY outbox ./outbox
COPY queues ./queues
COPY raft_store ./raft_store
COPY services ./services
COPY spark_reconcile ./spark_reconcile
COPY submission ./submission
COPY bench ./bench
RUN /opt/compensator/bin/pip install --no-deps '.[spark]' \
    && /opt/compensator/bin/pip check

FROM ${PYTHON_IMAGE} AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 compensator \
    && useradd --system --uid 10001 --gid compensator --home-dir /var/lib/compensator --create-home compensator \
    && chmod 0700 /var/lib/compensator
COPY --from=build /opt/compensator /opt/compensator
ENV PATH=/opt/compensator/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER compensator:compensator
WORKDIR /var/lib/compensator
ENTRYPOINT ["compensator"]
CMD ["--help"]
