# syntax=docker/dockerfile:1
# The attention node image: magicpig_attn_node on Debian 12 runtime libraries, as a non-root user.
#   docker build -f deploy/docker/attn_node.Dockerfile -t magicpig/attn-node:0.1.0 .
# Build stage: scripts/bootstrap (the project's Debian packages) and a Release build of the one
# target. Runtime stage: debian:bookworm-slim plus exactly the packages that own the libraries the
# binary loads (deploy/docker/runtime-packages.sh reads them off ldd in the build stage).
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY scripts/bootstrap scripts/bootstrap
RUN scripts/bootstrap
COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    set -eux; \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DMAGICPIG_BUILD_TESTS=OFF -DMAGICPIG_BUILD_BENCH=OFF; \
    scripts/build --target magicpig_attn_node; \
    install -D -m 0755 build/attn_node/magicpig_attn_node /out/bin/magicpig_attn_node; \
    deploy/docker/runtime-packages.sh /out/bin/magicpig_attn_node > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(cat /tmp/runtime-packages.txt); \
    rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt; \
    groupadd --system --gid 10001 magicpig; \
    useradd --system --uid 10001 --gid magicpig --home-dir /nonexistent --no-create-home \
            --shell /usr/sbin/nologin magicpig
COPY --from=build /out/bin/ /usr/local/bin/
# Fail the build, not the pod, when a shared library is missing.
RUN if ldd /usr/local/bin/magicpig_attn_node | grep 'not found'; then exit 1; fi
USER 10001:10001
# 50051: gRPC AttentionService + grpc.health.v1; 9091: /metrics, /healthz, /readyz.
EXPOSE 50051 9091
# Defaults as MAGICPIG_* variables, not CMD flags: flags on the command line would override the
# variables a Kubernetes ConfigMap sets (docs/flags.md).
ENV MAGICPIG_LISTEN=0.0.0.0:50051 MAGICPIG_METRICS_LISTEN=0.0.0.0:9091
ENTRYPOINT ["/usr/local/bin/magicpig_attn_node"]
