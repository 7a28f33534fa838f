// Package deploycheck keeps the deployment files — Dockerfile,
// .dockerignore, docker-compose.yml, the kustomize base, components and
// overlays in deploy/k8s, and deploy/rabbitmq/definitions.json — in step with
// the binaries they run: every command names a binary in cmd/, every --flag
// and NUDGE_* variable is one the binary really has (learned from its
// --help), values parse, and the timing and security settings that must
// agree (drain grace and send timeout, CronJob deadline, probe port,
// non-root, NetworkPolicy ports against the URLs, ScaledObject queues against
// the broker topology, RabbitMQ permissions against the topology's real
// names) do. They need no container engine and no cluster; the RabbitMQ
// permissions are also tried live when rabbitmqctl can reach the local
// broker:
//
//	go test ./internal/deploycheck/
//
// The checkers are ordinary code, one file per target (help.go parses
// --help, invocation.go resolves a command line against it, compose.go,
// kustomize.go, networkpolicy.go, components.go, dockerfile.go,
// dockerignore.go, rabbitmq.go, topology.go); nothing but this package's
// tests calls them. Each has a test of the real files and a table of
// deliberate breakages (deploy/deploytest) proving that it can fail.
//
// Strict decoding into the Kubernetes API types, kustomize build and the
// Prometheus rule loader live in the module deploy/check (make test-deploy),
// so that their dependencies stay out of this one; the two share
// deploy/manifest and deploy/deploytest rather than keeping copies.
package deploycheck
