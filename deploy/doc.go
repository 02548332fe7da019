// Package deploy holds the deployment artefacts of phonehome: the Dockerfile,
// the kustomize bases and overlays under kubernetes/, and example configs.
//
// It has no Go code of its own. Its tests (deploy_test.go) check that every
// manifest decodes strictly into the Kubernetes API types, that every
// kustomization builds, that every configuration shipped in a ConfigMap passes
// the binaries' --check-config, that every image is pinned, and that the
// shipped Prometheus rules pass promtool's unit tests.
package deploy
