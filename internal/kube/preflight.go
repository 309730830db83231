package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// permission is one thing a sandbox's launch does in its namespace.
type permission struct {
	verb, group, resource, subresource string
}

func (p permission) String() string {
	r := p.resource
	if p.subresource != "" {
		r += "/" + p.subresource
	}
	if p.group != "" {
		r += "." + p.group
	}
	return p.verb + " " + r
}

// permissions are what a launch does: create its objects, follow and
// attach to its Pod, read its logs, and remove it all.
var permissions = []permission{
	{"create", "", "pods", ""}, {"get", "", "pods", ""}, {"delete", "", "pods", ""}, {"deletecollection", "", "pods", ""},
	{"create", "", "pods", "attach"}, {"get", "", "pods", "log"},
	{"create", "", "secrets", ""}, {"patch", "", "secrets", ""}, {"deletecollection", "", "secrets", ""},
	{"create", "", "configmaps", ""}, {"patch", "", "configmaps", ""}, {"deletecollection", "", "configmaps", ""},
	{"create", "networking.k8s.io", "networkpolicies", ""}, {"patch", "networking.k8s.io", "networkpolicies", ""},
	{"deletecollection", "networking.k8s.io", "networkpolicies", ""},
}

// PreflightError lists what the cluster lacks for a launch, each with what
// to do about it.
type PreflightError struct {
	Problems []string
}

func (e *PreflightError) Error() string {
	return "the cluster cannot run this sandbox:\n  " + strings.Join(e.Problems, "\n  ")
}

// Preflight checks the cluster's own facts for objs: that it answers,
// that this identity may do what a launch does in the namespace (asked
// with SelfSubjectAccessReviews), that the runtime class the Pod names
// exists, and that a node has the image the Pod runs (it is never
// pulled). Every problem is in the one *PreflightError.
func (k *Cluster) Preflight(ctx context.Context, objs *generator.KubeObjects) error {
	if err := k.API.Ready(ctx); err != nil {
		return fmt.Errorf("the cluster's API server %s is not ready: %w", k.API.Config().Server, err)
	}
	var problems []string
	need := permissions
	for _, c := range objs.Pod.Spec.Containers {
		if c.Name == generator.KubeKeeperContainer || denied(objs) {
			// The workspace is copied out of the keeper with an exec, and
			// the policy's hold is probed with one.
			need = append(slices.Clone(permissions), permission{"create", "", "pods", "exec"})
			break
		}
	}
	for _, p := range need {
		ok, err := k.may(ctx, p)
		if err != nil {
			return err
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("you may not %s in namespace %s (ask for a Role that allows it)", p, k.Namespace))
		}
	}
	if rc := objs.Pod.Spec.RuntimeClassName; rc != "" {
		_, err := k.API.Do(ctx, http.MethodGet, "/apis/node.k8s.io/v1/runtimeclasses/"+url.PathEscape(rc), nil, nil)
		switch {
		case kubeapi.IsNotFound(err):
			problems = append(problems, fmt.Sprintf("runtime class %q does not exist (security.runtime names it; `kubectl get runtimeclass` lists those there are)", rc))
		case err != nil:
			return fmt.Errorf("looking up runtime class %q: %w", rc, err)
		}
	}
	images, err := k.nodeImages(ctx)
	if err != nil {
		return err
	}
	containers := slices.Concat(objs.Pod.Spec.InitContainers, objs.Pod.Spec.Containers)
	if objs.Gateway != nil {
		containers = append(containers, objs.Gateway.Spec.Containers...)
	}
	for _, c := range containers {
		if images != nil && c.ImagePullPolicy == "Never" && !images[normalizeImage(c.Image)] && !slices.Contains(problems, imageProblem(c.Image)) {
			problems = append(problems, imageProblem(c.Image))
		}
	}
	if len(problems) > 0 {
		return &PreflightError{Problems: problems}
	}
	return nil
}

func imageProblem(image string) string {
	return fmt.Sprintf("no node has the image %s, and it is never pulled (load it into the nodes' runtime)", image)
}

// may asks the API server whether this identity may do p in the namespace.
func (k *Cluster) may(ctx context.Context, p permission) (bool, error) {
	review := map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
		"spec": map[string]any{"resourceAttributes": map[string]string{
			"namespace": k.Namespace, "verb": p.verb, "group": p.group, "resource": p.resource, "subresource": p.subresource,
		}},
	}
	b, _ := json.Marshal(review)
	raw, err := k.API.Do(ctx, http.MethodPost, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", nil, b)
	if err != nil {
		return false, fmt.Errorf("asking the API server what you may do: %w", err)
	}
	var out struct {
		Status struct {
			Allowed bool `json:"allowed"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return false, fmt.Errorf("asking the API server what you may do: %w", err)
	}
	return out.Status.Allowed, nil
}

// nodeStatusMaxImages is the kubelet's default cap on the images a node's
// status lists.
const nodeStatusMaxImages = 50

// nodeImages are the images the nodes report they have, by normalized
// name; nil when that cannot be told (not allowed to list nodes, or a
// node's list at the kubelet's cap).
func (k *Cluster) nodeImages(ctx context.Context) (map[string]bool, error) {
	raw, err := k.API.Do(ctx, http.MethodGet, "/api/v1/nodes", nil, nil)
	var st *kubeapi.StatusError
	if errors.As(err, &st) && st.Code == http.StatusForbidden {
		// Nodes are cluster-wide; an identity that may not list them
		// cannot be told: the kubelet says so when the Pod starts.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the nodes' images: %w", err)
	}
	var nodes struct {
		Items []struct {
			Status struct {
				Images []struct {
					Names []string `json:"names"`
				} `json:"images"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return nil, fmt.Errorf("listing the nodes' images: %w", err)
	}
	have := map[string]bool{}
	for _, n := range nodes.Items {
		if len(n.Status.Images) >= nodeStatusMaxImages {
			// The kubelet lists this many at most: an image not in the
			// list may be on the node all the same.
			return nil, nil
		}
		for _, im := range n.Status.Images {
			for _, name := range im.Names {
				have[normalizeImage(name)] = true
			}
		}
	}
	return have, nil
}

// normalizeImage names an image as a node reports it: docker.io/ for a
// name without a registry, library/ for an official one, :latest for none.
func normalizeImage(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref
	}
	name, tag := ref, "latest"
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		name, tag = ref[:i], ref[i+1:]
	}
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash || !strings.ContainsAny(first, ".:") && first != "localhost" {
		if !hasSlash {
			name = "library/" + name
		}
		name = "docker.io/" + name
	}
	return name + ":" + tag
}
