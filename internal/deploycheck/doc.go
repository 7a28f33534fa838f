// Package deploycheck holds only tests. They keep the deployment files —
// Dockerfile, .dockerignore, docker-compose.yml, the kustomize base,
// components and overlays in deploy/k8s, and deploy/rabbitmq/definitions.json
// — in step with the binaries they run: every command names a binary in
// cmd/, every --flag and NUDGE_* variable is one the binary really has
// (learned from its --help), values parse, and the timing and security
// settings that must agree (drain grace and send timeout, CronJob deadline,
// probe port, non-root, NetworkPolicy ports against the URLs, ScaledObject
// queues against the broker topology, RabbitMQ permissions against the
// topology's real names) do. They need no container engine and no cluster;
// the RabbitMQ permissions are also tried live when rabbitmqctl can reach the
// local broker:
//
//	go test ./internal/deploycheck/
//
// Strict decoding into the Kubernetes API types, kustomize build and the
// Prometheus rule loader live in the module deploy/check (make test-deploy),
// so that their dependencies stay out of this one.
package deploycheck
