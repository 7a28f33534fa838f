// Package deploycheck holds only tests. They keep the deployment files —
// Dockerfile, .dockerignore, docker-compose.yml and the kustomize manifests
// in deploy/k8s — in step with the binaries they run: every command names a
// binary in cmd/, every --flag and NUDGE_* variable is one the binary really
// has (learned from its --help), values parse, and the timing and security
// settings that must agree (drain grace, CronJob deadline, probe port,
// non-root) do. They need no container engine and no cluster:
//
//	go test ./internal/deploycheck/
package deploycheck
