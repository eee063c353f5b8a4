# syntax=docker/dockerfile:1
# shardgate container image: builds from this repository alone.
#
#   docker build -t shardgate:dev .
#   docker run --rm -p 8081:8081 -p 8080:8080 shardgate:dev   # serves config/example.yaml
#   docker run --rm -p 8081:8081 -v "$PWD/limits:/etc/shardgate/limits:ro" shardgate:dev
#
# The image sets no SHARDGATE_* variable: a Deployment made for envoyproxy/ratelimit's
# image configures it with upstream's variables (RUNTIME_ROOT, GRPC_PORT, PORT, LOG_LEVEL,
# REDIS_URL...), which an image variable of ours would shadow. The defaults are the
# binary's own: rules from /etc/shardgate/limits, gRPC on 0.0.0.0:8081, HTTP on
# 0.0.0.0:8080, text logs (LOG_FORMAT=json or SHARDGATE_LOG_FORMAT=json for JSON).
#
# Builder and runtime use the same Debian release, so the binary's glibc matches.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
# Every target the manifest names must be present for cargo to read it, though only the
# server is built.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY benches ./benches
COPY bench/tools ./bench/tools
# Cache mounts keep the crate registry and compiled dependencies between builds; the binary
# is copied out of the cached target directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin shardgate \
    && cp target/release/shardgate /usr/local/bin/shardgate

FROM ${RUNTIME_IMAGE}
# ca-certificates: TLS to DynamoDB (the AWS SDK trusts the system roots). Unpinned on
# purpose: the root set should be the release's current one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 shardgate \
    && useradd --system --uid 10001 --gid shardgate --no-create-home --shell /usr/sbin/nologin shardgate
COPY --from=build /usr/local/bin/shardgate /usr/local/bin/shardgate
# envoyproxy/ratelimit's entrypoint name: a Deployment made for upstream's image (Envoy
# Gateway's sets `command: ["/bin/ratelimit"]`) starts shardgate's server, configured by
# upstream's variables. (/bin is /usr/bin on this release.)
RUN ln -s /usr/local/bin/shardgate /usr/bin/ratelimit
# A default config so the image runs as is (the binary's default rule directory); mount a
# file or a directory (a Kubernetes ConfigMap) over /etc/shardgate/limits to replace it, or
# set upstream's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY, or SHARDGATE_CONFIG.
COPY config/example.yaml /etc/shardgate/limits/example.yaml

# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# 8081: gRPC — Envoy's RateLimitService, grpc.health.v1 (service names "", "ratelimit"),
#       reflection.
# 8080: HTTP — /metrics (Prometheus), /healthcheck, /rlconfig, /json.
EXPOSE 8081 8080

# GET /healthcheck: 200 while the store answers, 503 while it does not. The image carries
# no HTTP client, so bash speaks the one request itself (HTTP/1.0, the server closes). The
# HTTP port is the server's: SHARDGATE_HTTP_ADDR's, else upstream's PORT, else 8080.
# Kubernetes uses its own probes instead (see envoy-examples/).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "p=${SHARDGATE_HTTP_ADDR##*:}; p=${p:-${PORT:-8080}}; exec 3<>/dev/tcp/127.0.0.1/$p && printf 'GET /healthcheck HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && read -r _ status _ <&3 && [ \"$status\" = 200 ]"]

ENTRYPOINT ["/usr/local/bin/shardgate"]
CMD ["serve"]
