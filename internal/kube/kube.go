// Package kube puts a sandbox's objects (generator.KubeObjects) on a
// Kubernetes cluster and takes them off again: ordered creation with the
// Pod owning the rest, removal by the sandbox's label (what a killed
// launcher left), the list of sandboxes, and the preflight of the
// cluster's own facts. It talks to the API server through
// internal/kubeapi, and prints nothing.
//
// The launch (internal/sandbox) drives it for `run --engine kubernetes`,
// and gc for what killed launchers left.
package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/backend"
	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// Cluster is a namespace of a cluster, reached with one identity.
type Cluster struct {
	API       *kubeapi.Client
	Namespace string
}

// New returns the cluster of c in namespace (c's context's namespace when "").
func New(c *kubeapi.Client, namespace string) *Cluster {
	if namespace == "" {
		namespace = c.Config().Namespace
	}
	return &Cluster{API: c, Namespace: namespace}
}

// Created is what Create made.
type Created struct {
	Pod string
	UID string
}

// Create creates the objects: the NetworkPolicies first (so that they are
// there when the Pod gets its address), the Secret with the values env
// gives for the passed variables (unset ones are left out, as an engine
// leaves them unset), the ConfigMap, then the Pod; then it makes the Pod
// the owner of the others, so that the Pod's deletion, by anyone,
// removes them. On an error it removes what it made. Errors never hold a
// variable's value.
func (k *Cluster) Create(ctx context.Context, objs *generator.KubeObjects, env func(string) (string, bool)) (_ *Created, err error) {
	name := objs.Pod.Metadata.Name
	defer func() {
		if err != nil {
			if rerr := k.Remove(context.WithoutCancel(ctx), name); rerr != nil {
				err = errors.Join(err, fmt.Errorf("removing what was made: %w", rerr))
			}
		}
	}()
	var owned []string // collection paths and names, for the owner references
	create := func(obj any) error {
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		var head kubeapi.Object
		_ = json.Unmarshal(b, &head)
		if _, err := k.API.Create(ctx, k.Namespace, b, kubeapi.CreateOptions{}); err != nil {
			return err
		}
		if head.Kind != "Pod" || head.Metadata.Name != name {
			p, _ := kubeapi.Path(head.APIVersion, head.Kind, k.Namespace)
			owned = append(owned, p+"/"+head.Metadata.Name)
		}
		return nil
	}
	for i := range objs.Policies {
		if err := create(k.placed(objs.Policies[i])); err != nil {
			return nil, err
		}
	}
	if objs.Secret != nil {
		s := *objs.Secret
		s.StringData = map[string]string{}
		for _, n := range objs.EnvPassed {
			if v, ok := env(n); ok {
				s.StringData[n] = v
			}
		}
		if err := create(k.placed(s)); err != nil {
			return nil, err
		}
	}
	if objs.ConfigMap != nil {
		if err := create(k.placed(*objs.ConfigMap)); err != nil {
			return nil, err
		}
	}
	if objs.Gateway != nil {
		// The allowlist's gateway runs first: the sandbox names it by its
		// Pod's address.
		if err := create(k.placed(*objs.Gateway)); err != nil {
			return nil, err
		}
		addr, err := k.gatewayAddress(ctx, objs.Gateway.Metadata.Name)
		if err != nil {
			return nil, err
		}
		named := *objs
		named.SetGatewayAddress(addr)
		objs = &named
	}
	pod := objs.Pod
	if objs.Secret != nil {
		// A variable unset on the host is unset in the sandbox: its key is
		// optional.
		pod.Spec.Containers = slices.Clone(pod.Spec.Containers)
		for ci := range pod.Spec.Containers {
			pod.Spec.Containers[ci].Env = optionalSecretKeys(pod.Spec.Containers[ci].Env)
		}
	}
	b, err := json.Marshal(k.placed(pod))
	if err != nil {
		return nil, err
	}
	raw, err := k.API.Create(ctx, k.Namespace, b, kubeapi.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var made struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &made); err != nil || made.Metadata.UID == "" {
		return nil, fmt.Errorf("the API server's answer names no uid for pod %s: %v", name, err)
	}
	patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q,"blockOwnerDeletion":false}]}}`, name, made.Metadata.UID)
	for _, p := range owned {
		if _, err := k.API.Patch(ctx, p, "application/merge-patch+json", []byte(patch)); err != nil {
			return nil, fmt.Errorf("making pod %s the owner of %s: %w", name, p, err)
		}
	}
	return &Created{Pod: name, UID: made.Metadata.UID}, nil
}

// gatewayWait bounds the wait for the gateway's Pod to run.
const gatewayWait = 2 * time.Minute

// gatewayAddress waits (bounded) until the gateway's Pod runs, and
// returns its address. A Pod that cannot run is an error saying why.
func (k *Cluster) gatewayAddress(ctx context.Context, name string) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, gatewayWait)
	defer cancel()
	var ip string
	_, err := k.waitPod(ctx, name, func(s podStatus) (bool, error) {
		if s.Status.Phase == "Running" && s.Status.PodIP != "" {
			ip = s.Status.PodIP
			return true, nil
		}
		if err := s.failure(); err != nil {
			return false, err
		}
		if s.Status.Phase == "Succeeded" || s.Status.Phase == "Failed" {
			return false, fmt.Errorf("the gateway's pod ended (%s)", s.Status.Phase)
		}
		return false, nil
	})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("starting the allowlist's gateway %s: %w", name, err)
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("the gateway's pod %s has the address %q: %w", name, ip, err)
	}
	return addr, nil
}

// optionalSecretKeys marks each Secret key reference optional.
func optionalSecretKeys(env []generator.KubeEnv) []generator.KubeEnv {
	out := slices.Clone(env)
	for i := range out {
		if out[i].ValueFrom != nil && out[i].ValueFrom.SecretKeyRef != nil {
			v, ref := *out[i].ValueFrom, *out[i].ValueFrom.SecretKeyRef
			ref.Optional = true
			v.SecretKeyRef = &ref
			out[i].ValueFrom = &v
		}
	}
	return out
}

// placed returns obj with metadata.namespace set to the cluster's.
func (k *Cluster) placed(obj any) any {
	switch o := obj.(type) {
	case generator.KubeNetworkPolicy:
		o.Metadata.Namespace = k.Namespace
		return o
	case generator.KubeSecret:
		o.Metadata.Namespace = k.Namespace
		return o
	case generator.KubeConfigMap:
		o.Metadata.Namespace = k.Namespace
		return o
	case generator.KubePod:
		o.Metadata.Namespace = k.Namespace
		return o
	}
	return obj
}

// collections are what a sandbox's objects are, for their removal by label.
var collections = []struct{ apiVersion, kind string }{
	{"v1", "Pod"}, {"v1", "Secret"}, {"v1", "ConfigMap"}, {"networking.k8s.io/v1", "NetworkPolicy"},
}

// Remove deletes every object of the sandbox name in the namespace, by its
// label: the Pod at once (no grace period), and what it owns, or what a
// killed launcher made before it made the Pod their owner.
func (k *Cluster) Remove(ctx context.Context, name string) error {
	q := url.Values{
		"labelSelector":      {generator.KubeLabelManagedBy + "=" + generator.KubeManagedBy + "," + generator.KubeLabelSandbox + "=" + name},
		"gracePeriodSeconds": {"0"},
	}
	var errs []error
	for _, c := range collections {
		p, _ := kubeapi.Path(c.apiVersion, c.kind, k.Namespace)
		if _, err := k.API.Do(ctx, http.MethodDelete, p, q, nil); err != nil && !kubeapi.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("removing the %ss of sandbox %s: %w", strings.ToLower(c.kind), name, err))
		}
	}
	return errors.Join(errs...)
}

// Sandbox is a sandbox's Pod as List finds it.
type Sandbox struct {
	Name      string
	Phase     string
	Workspace string
	Profile   string
	// PID and Host are the launcher's, as its annotations say (0 and ""
	// when they say none).
	PID     int
	Host    string
	Created time.Time
}

// List returns the sandboxes of the namespace: the Pods propio-sandbox
// made, by their labels.
func (k *Cluster) List(ctx context.Context) ([]Sandbox, error) {
	p, _ := kubeapi.Path("v1", "Pod", k.Namespace)
	q := url.Values{"labelSelector": {generator.KubeLabelManagedBy + "=" + generator.KubeManagedBy + "," + generator.KubeLabelRole + "=sandbox"}}
	raw, err := k.API.Do(ctx, http.MethodGet, p, q, nil)
	if err != nil {
		return nil, fmt.Errorf("listing the sandboxes of namespace %s: %w", k.Namespace, err)
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string            `json:"name"`
				Annotations       map[string]string `json:"annotations"`
				CreationTimestamp time.Time         `json:"creationTimestamp"`
			} `json:"metadata"`
			Status struct {
				Phase string `json:"phase"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("listing the sandboxes of namespace %s: %w", k.Namespace, err)
	}
	out := make([]Sandbox, 0, len(list.Items))
	for _, it := range list.Items {
		a := it.Metadata.Annotations
		pid, _ := strconv.Atoi(a[AnnLauncherPID])
		out = append(out, Sandbox{Name: it.Metadata.Name, Phase: it.Status.Phase, Workspace: a[generator.KubeAnnWorkspace],
			Profile: a[generator.KubeAnnProfile], PID: pid, Host: a[AnnLauncherHost], Created: it.Metadata.CreationTimestamp})
	}
	slices.SortFunc(out, func(a, b Sandbox) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Annotations on every object of a sandbox a launcher made, naming it: gc
// removes what a launcher that is gone left (backend.LauncherAlive).
const (
	AnnLauncherPID  = "propio-sandbox.dev/launcher-pid"
	AnnLauncherHost = "propio-sandbox.dev/launcher-host"
)

// Stamp annotates every object of objs with the launcher pid on host.
func Stamp(objs *generator.KubeObjects, pid int, host string) {
	stamp := func(m *generator.KubeMeta) {
		m.Annotations = maps.Clone(m.Annotations)
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[AnnLauncherPID] = strconv.Itoa(pid)
		m.Annotations[AnnLauncherHost] = host
	}
	if objs.Secret != nil {
		s := *objs.Secret
		stamp(&s.Metadata)
		objs.Secret = &s
	}
	if objs.ConfigMap != nil {
		c := *objs.ConfigMap
		stamp(&c.Metadata)
		objs.ConfigMap = &c
	}
	objs.Policies = slices.Clone(objs.Policies)
	for i := range objs.Policies {
		stamp(&objs.Policies[i].Metadata)
	}
	if objs.Gateway != nil {
		g := *objs.Gateway
		stamp(&g.Metadata)
		objs.Gateway = &g
	}
	stamp(&objs.Pod.Metadata)
}

// Leftover is a sandbox whose launcher is gone, as Leftovers finds it.
type Leftover struct {
	Name string
	PID  int
	Host string
}

// Leftovers are the sandboxes of the namespace whose launcher, on this
// host, is gone (killed before it could remove them): every object
// propio-sandbox made, by the sandbox's label, with the launcher its
// annotations name. One of a live launcher, of another host, or of no
// launcher named, is never one.
func (k *Cluster) Leftovers(ctx context.Context) ([]Leftover, error) {
	q := url.Values{"labelSelector": {generator.KubeLabelManagedBy + "=" + generator.KubeManagedBy}}
	found := map[string]Leftover{}
	live := map[string]bool{}
	for _, c := range collections {
		p, _ := kubeapi.Path(c.apiVersion, c.kind, k.Namespace)
		raw, err := k.API.Do(ctx, http.MethodGet, p, q, nil)
		if err != nil {
			return nil, fmt.Errorf("listing the %ss of namespace %s: %w", strings.ToLower(c.kind), k.Namespace, err)
		}
		var list struct {
			Items []struct {
				Metadata struct {
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("listing the %ss of namespace %s: %w", strings.ToLower(c.kind), k.Namespace, err)
		}
		for _, it := range list.Items {
			name := it.Metadata.Labels[generator.KubeLabelSandbox]
			if name == "" {
				continue
			}
			pid, _ := strconv.Atoi(it.Metadata.Annotations[AnnLauncherPID])
			host := it.Metadata.Annotations[AnnLauncherHost]
			if backend.LauncherAlive(pid, host) {
				live[name] = true
				continue
			}
			found[name] = Leftover{Name: name, PID: pid, Host: host}
		}
	}
	var out []Leftover
	for name, l := range found {
		if !live[name] {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b Leftover) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
