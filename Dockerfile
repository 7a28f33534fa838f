# syntax=docker/dockerfile:1
#
# One image holds every Nudge binary (dispatcher, email-worker, sms-worker,
# webhook-worker, reconciler, nudgectl, fake-sms) in /usr/local/bin; each service picks its
# command. Build:
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t nudge:dev .
#
# The build is the same as `make build`: CGO_ENABLED=0 go build ./cmd/...
# (internal/deploycheck keeps the two in step).

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Module downloads are cached in their own layer, keyed on go.mod and go.sum.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/nudgehq/nudge/internal/config.Version=${VERSION}" \
      -o /out/ ./cmd/...

# Static binaries only: no shell, no package manager, no curl. Container
# healthchecks therefore cannot exec anything; Kubernetes probes the HTTP
# endpoints (/healthz, /readyz on :8080) directly.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
# nonroot is uid/gid 65532 in distroless; Kubernetes manifests pin the same.
USER 65532:65532
# No ENTRYPOINT: the command names the binary, e.g. ["dispatcher", "--every", "5s"].
CMD ["nudgectl", "--help"]
