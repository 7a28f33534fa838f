# Nudge: the two commands a new user runs are `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/nudgehq/nudge/internal/config.Version=$(VERSION)
export GOFLAGS := -buildvcs=false

.PHONY: all build test test-deploy test-short demo services vet fmt clean chaos chaos-short bench

all: build

## build: every binary into bin/
build:
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

## services: install or start PostgreSQL, RabbitMQ and Mailpit when missing
services:
	scripts/ensure-services.sh

## test: vet, then every test against the real PostgreSQL, RabbitMQ and Mailpit
test: services
	go vet ./...
	go test -race -count=1 -timeout 15m ./...
	$(MAKE) chaos-short
	$(MAKE) test-deploy

## test-deploy: manifests decoded strictly into the Kubernetes API types, kustomize
## build, Prometheus rules; a module of its own (deploy/check), no cluster needed
test-deploy:
	cd deploy/check && go vet ./... && go test -count=1 ./...

## chaos-short: the chaos run on 5,000 reminders (kills, broker connection closes, a PostgreSQL restart)
chaos-short:
	NUDGE_CHAOS=short go test -count=1 -timeout 10m -run TestChaos -v ./internal/chaos/ | grep -v '^\s*{'

## chaos: the full chaos run on 20,000 reminders; its table lands in docs/chaos-latest.md
chaos: services
	NUDGE_CHAOS=full NUDGE_CHAOS_REPORT=$(CURDIR)/docs/chaos-latest.md \
		go test -count=1 -timeout 20m -run TestChaos -v ./internal/chaos/ | grep -v '^\s*{'

## test-short: unit tests only, no services needed
test-short:
	go test -short -count=1 ./...

## demo: run the whole system end to end on this machine and print the outcomes
demo: services build
	go run ./tools/demo

## bench: Nudge end to end vs River vs the raw broker (bench/, a module of its own);
## writes docs/benchmarks.md and its chart. BENCH_N=100000 for the issue's full size.
BENCH_N ?= 20000
BENCH_RUNS ?= 3
bench: services
	cd bench && go run ./cmd/nudge-bench -n $(BENCH_N) -runs $(BENCH_RUNS)

vet:
	go vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin .demo
