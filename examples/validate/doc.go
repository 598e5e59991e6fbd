// Package validate checks the deployment files of the repository without Docker or a
// cluster: docker-compose.yml through the compose specification's own loader and JSON
// schema (compose-go), the Dockerfiles through BuildKit's parser, the .dockerignore
// files through Docker's pattern matcher, and the Kubernetes manifests of
// examples/k8s by decoding them strictly into the typed objects of k8s.io/api, plus
// checks of how the pieces fit (socket and cache paths, users, sizes, versions).
//
// It is a module of its own, so that the main module does not depend on Kubernetes
// or compose-go:
//
//	cd examples/validate && go test ./...
package validate
