// Package manifest reads the Kubernetes manifests under deploy/k8s the way
// both deployment checks need them: it splits a multi-document YAML file into
// its documents, raw, for each check to decode its own way, and it knows the
// tree's layout (a base, components/*, overlays/*).
//
// It exists outside internal/ because two modules share it: the main
// module's internal/deploycheck, which checks the manifests against the
// binaries, and deploy/check, a module of its own (it requires the main module
// through a replace directive) because it pulls in the Kubernetes API types,
// which the main module must not depend on. It imports the standard library
// only, so that neither module gains a dependency through it. No binary
// imports it, and the image's build context leaves deploy/ out.
package manifest
