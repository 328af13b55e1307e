# syntax=docker/dockerfile:1
# pgtarn's container image: a PgBouncer-compatible PostgreSQL pooler.
#
#   docker build -t pgtarn .
#   docker run -p 6432:6432 -e DATABASE_URL=postgres://app:secret@db:5432/app pgtarn
#
# Configuration: a pgbouncer.ini mounted at /etc/pgtarn/pgbouncer.ini (or named by
# PGTARN_CONFIG) is run as it is; otherwise `pgtarn container` writes pgbouncer.ini and
# userlist.txt into /run/pgtarn from DATABASE_URL or DB_HOST/DB_PORT/DB_USER/DB_PASSWORD/DB_NAME
# and POOL_MODE, DEFAULT_POOL_SIZE, MAX_CLIENT_CONN, AUTH_TYPE... (docs/deployment.md, "Container image").
# Arguments after the image name go to pgtarn (e.g. -v).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the wheel with the hot path compiled by mypyc, and the dependencies' wheels ------
FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# mypyc type-checks the compiled modules, so it must see their imports (pglast...): the
# dependencies go in first (pure pgtarn brings them), then the wheel is built without build
# isolation, in this environment. The build fails unless the result is compiled.
RUN pip install --no-cache-dir "setuptools>=68" wheel "mypy>=1.10" \
    && PGTARN_PURE=1 pip install --no-cache-dir . \
    && pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels . \
    && pip install --no-cache-dir --force-reinstall --no-deps /wheels/pgtarn-*.whl \
    && cd / && python -m pgtarn --version | tee /dev/stderr | grep -q compiled

# --- runtime: slim Python, the wheels, no compiler, a user of its own ---------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PGTARN_RUN_DIR=/run/pgtarn
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels pgtarn \
    && groupadd --system --gid 10001 pgtarn \
    && useradd --system --uid 10001 --gid pgtarn --home-dir /run/pgtarn --no-create-home \
       --shell /usr/sbin/nologin pgtarn \
    && install -d -o pgtarn -g pgtarn -m 0700 /run/pgtarn \
    && install -d -m 0755 /etc/pgtarn
USER 10001:10001
WORKDIR /run/pgtarn
EXPOSE 6432
# SIGTERM (docker stop, Kubernetes) as PgBouncer: stop accepting, exit once every client has
# left; a second SIGTERM exits at once. SIGINT: exit once the servers are released; SIGQUIT:
# at once. SIGHUP reloads the ini (a generated one is written only at start).
STOPSIGNAL SIGTERM
# an SSLRequest answered: the pooler's event loop runs, not just a socket the kernel accepts
HEALTHCHECK --interval=10s --timeout=5s --start-period=5s --retries=3 \
    CMD ["pgtarn", "container", "health"]
ENTRYPOINT ["pgtarn", "container"]
CMD []
