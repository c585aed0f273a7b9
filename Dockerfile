# syntax=docker/dockerfile:1
# One image for every role: `sluice console`, `sluice enforcer`, `sluice migrate`, ...
#   docker build -t sluice .
# Stages: the UI (Node) -> the binary with the UI embedded (Go) -> a slim runtime.

# --- 1. UI: web/src -> web/dist ---------------------------------------------------------
FROM node:20-bookworm-slim AS ui
WORKDIR /src
# Vite 8 wants npm 11's handling of optional native packages.
RUN npm install -g npm@11
COPY package.json package-lock.json ./
RUN npm ci
COPY vite.config.ts tsconfig.json ./
COPY web/ web/
RUN npm run build

# --- 2. Go: bin/sluice with web/dist embedded --------------------------------------------
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# Only the Go tree (the top-level layout is fixed in DESIGN.md), so local
# node_modules/, .data/ or bin/ never reach the image.
COPY cmd/ cmd/
COPY rules/ rules/
COPY enforcer/ enforcer/
COPY backend/ backend/
COPY migrations/ migrations/
COPY internal/ internal/
COPY web/*.go web/
COPY --from=ui /src/web/dist/ web/dist/
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -tags=nomsgpack -ldflags='-s -w' -o /out/sluice ./cmd/sluice

# --- 3. Runtime ----------------------------------------------------------------------------
FROM debian:bookworm-slim
# curl is for the health checks (docker-compose.yml); ca-certificates for TLS to Postgres/Redis.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sluice \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/sluice --create-home --shell /usr/sbin/nologin sluice \
 && install -d -o 10001 -g 10001 -m 0700 /etc/sluice/bootstrap
COPY --from=build /out/sluice /usr/local/bin/sluice
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/sluice
# Console :8080; enforcer HTTP :8081 and gRPC :8082.
EXPOSE 8080 8081 8082
# The enforcer keeps its last-known-good ruleset here (--state-dir).
VOLUME ["/var/lib/sluice"]
# /etc/sluice/bootstrap is where docker-compose.yml's console writes the
# enforcers' fleet node token: a volume mounted there starts owned by the
# sluice user, as the directory is in the image.
ENTRYPOINT ["/usr/local/bin/sluice"]
