// Package check holds deployment checks whose dependencies must stay out of
// the main module: every Kubernetes manifest under deploy/k8s (the sources
// and what `kustomize build` renders from them) is decoded strictly into the
// real API types of k8s.io/api and of the Prometheus Operator, unknown and
// duplicate fields being errors; kustomize itself builds the base and every
// overlay in-process; and the PrometheusRule's rules go through Prometheus's
// own rule loader, which parses every PromQL expression and template.
//
// It needs no cluster and no container engine:
//
//	cd deploy/check && go test ./...   (or make test-deploy)
//
// internal/deploycheck, in the main module, checks the same files against the
// binaries' real flags, the broker topology and each other. The two share
// deploy/manifest (splitting the YAML files, the tree's layout) and
// deploy/deploytest (breaking copies of the files in tests): this module
// requires the main module through `replace github.com/nudgehq/nudge => ../..`,
// and the main module never requires this one, so that the Kubernetes
// dependencies stay here.
package check
