# syntax=docker/dockerfile:1
# The compute node image: magicpig_gpu_node on Debian 12 runtime libraries, as a non-root user.
#   docker build -f deploy/docker/gpu_node.Dockerfile -t magicpig/gpu-node:0.1.0 .
#   docker build -f deploy/docker/gpu_node.Dockerfile --build-arg MAGICPIG_WITH_CUDA=ON \
#                -t magicpig/gpu-node:0.1.0-cuda .
#   docker build ... --build-arg MAGICPIG_BAKE_MODEL=1 ...   (model inside the image)
# Build stage: scripts/bootstrap (the project's Debian packages) and a Release build of the one
# target. Runtime stage: debian:bookworm-slim plus exactly the packages that own the libraries the
# binary loads (deploy/docker/runtime-packages.sh reads them off ldd in the build stage).
#
# CUDA variant (MAGICPIG_WITH_CUDA=ON): the toolkit comes from Debian's non-free section
# (nvidia-cuda-toolkit 11.8 with nvidia-cuda-toolkit-gcc, whose cuda-g++ is a host compiler nvcc
# accepts), so the rest of the package set stays the same; the runtime stage then installs the
# CUDA runtime libraries (libcudart11.0, libcublas11, ...) the same way as the others. The driver
# (libcuda.so.1) is not in the image: the NVIDIA container toolkit mounts it from the host.
# CUDA 11.8 predates the sm_90a target the project builds by default (CMakeLists.txt), so this
# variant builds sm_90 machine code plus compute_90 PTX. Not built here yet: the development
# machines reach Debian's packages but not Docker Hub (docs/deploy.md says what was checked).
# An nvidia/cuda base (e.g. nvidia/cuda:12.4.1-devel-ubuntu22.04 to build, -runtime- to run) gives
# a newer CUDA but is Ubuntu, whose Abseil/gRPC/protobuf versions differ from bookworm's, so
# scripts/bootstrap's package set does not carry over; for CUDA 12 on this Debian base use NVIDIA's
# CUDA apt repository for Debian 12 (cuda-keyring, then cuda-toolkit-12-x) in both stages instead.
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE} AS build
ARG MAGICPIG_WITH_CUDA=OFF
ARG MAGICPIG_BAKE_MODEL=0
WORKDIR /src
COPY scripts/bootstrap scripts/bootstrap
RUN scripts/bootstrap
RUN set -eux; \
    if [ "$MAGICPIG_WITH_CUDA" = ON ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
          /etc/apt/sources.list.d/debian.sources; \
      apt-get update; \
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
          nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc; \
    fi
COPY . .
RUN --mount=type=cache,target=/root/.cache/ccache \
    set -eux; \
    cuda_flags=""; \
    if [ "$MAGICPIG_WITH_CUDA" = ON ]; then \
      cuda_flags="-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/cuda-g++ -DCMAKE_CUDA_ARCHITECTURES=90-real;90-virtual"; \
    fi; \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
          -DMAGICPIG_BUILD_TESTS=OFF -DMAGICPIG_BUILD_BENCH=OFF \
          -DMAGICPIG_WITH_CUDA=${MAGICPIG_WITH_CUDA} $cuda_flags; \
    scripts/build --target magicpig_gpu_node; \
    install -D -m 0755 build/gpu_node/magicpig_gpu_node /out/bin/magicpig_gpu_node; \
    deploy/docker/runtime-packages.sh /out/bin/magicpig_gpu_node > /out/runtime-packages.txt; \
    cat /out/runtime-packages.txt; \
    mkdir -p /out/models; \
    if [ "$MAGICPIG_BAKE_MODEL" = 1 ]; then scripts/fetch-model && cp models/*.gguf /out/models/; fi

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG MAGICPIG_WITH_CUDA=OFF
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN set -eux; \
    if [ "$MAGICPIG_WITH_CUDA" = ON ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
          /etc/apt/sources.list.d/debian.sources; \
    fi; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(cat /tmp/runtime-packages.txt); \
    rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt; \
    groupadd --system --gid 10001 magicpig; \
    useradd --system --uid 10001 --gid magicpig --home-dir /nonexistent --no-create-home \
            --shell /usr/sbin/nologin magicpig
COPY --from=build /out/bin/ /usr/local/bin/
# Empty unless built with MAGICPIG_BAKE_MODEL=1.
COPY --from=build /out/models/ /opt/magicpig/models/
# Fail the build, not the pod, when a shared library is missing (the driver's come at run time).
RUN if ldd /usr/local/bin/magicpig_gpu_node | grep 'not found' \
        | grep -v -e libcuda -e libnvidia-; then \
      exit 1; \
    fi
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
# 8000: /v1/* (OpenAI-compatible), /healthz, /readyz, /health, /metrics.
EXPOSE 8000
# Defaults as MAGICPIG_* variables, not CMD flags: flags on the command line would override the
# variables a Kubernetes ConfigMap sets (docs/flags.md).
ENV MAGICPIG_MODEL=/opt/magicpig/models/SmolLM2-135M-Instruct.Q4_1.gguf \
    MAGICPIG_LISTEN=0.0.0.0:8000
ENTRYPOINT ["/usr/local/bin/magicpig_gpu_node"]
