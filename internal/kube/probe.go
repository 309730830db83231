package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// Enforcement is what ProbePolicy found out about the cluster's CNI.
type Enforcement struct {
	// Known: the probe could tell (the Pod without a policy reached the
	// server); Enforced: the Pod under a deny-all policy could not.
	Known, Enforced bool
	// Why says what was seen.
	Why string
}

// probePort is the port the probe's server listens on.
const probePort = 8080

// Probe programs, run with python3 and bash from image: a server that
// accepts connections, and a client that tries to connect to it a few
// times, after the CNI has had time to program a policy for it.
const (
	probeServer = `import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080)); s.listen(16)
while True:
    c, _ = s.accept(); c.close()`
	probeClient = `sleep 3; for i in 1 2 3; do if timeout 2 bash -c 'exec 3<>/dev/tcp/$0/8080' "$1"; then echo reached; exit 0; fi; sleep 1; done; echo blocked; exit 1`
)

// ProbePolicy tells whether the cluster's CNI enforces NetworkPolicy: it
// starts, in the namespace, a server Pod and two client Pods of image
// (which must have python3 and bash, as propio-sandbox/agent does), one of
// them under a policy that denies all egress; the client without a policy
// must reach the server (else nothing can be told), the one under it must
// not. Everything it made is removed before it returns; the whole probe is
// bounded by ctx.
func (k *Cluster) ProbePolicy(ctx context.Context, image string) (_ Enforcement, err error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return Enforcement{}, err
	}
	name := "propio-probe-" + hex.EncodeToString(b)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := k.Remove(rctx, name); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	meta := func(suffix, role string) generator.KubeMeta {
		return generator.KubeMeta{Name: name + suffix, Namespace: k.Namespace, Labels: map[string]string{
			generator.KubeLabelManagedBy: generator.KubeManagedBy, generator.KubeLabelSandbox: name, generator.KubeLabelRole: role,
		}}
	}
	pod := func(suffix, role string, args ...string) generator.KubePod {
		res := map[string]string{"cpu": "50m", "memory": "32Mi"}
		return generator.KubePod{APIVersion: "v1", Kind: "Pod", Metadata: meta(suffix, role), Spec: generator.KubePodSpec{
			RestartPolicy: "Never", TerminationGracePeriodSeconds: 0,
			SecurityContext: generator.KubePodSecurity{RunAsUser: 65534, RunAsGroup: 65534, RunAsNonRoot: true,
				SeccompProfile: generator.KubeSeccompProfile{Type: "RuntimeDefault"}},
			Containers: []generator.KubeContainer{{
				Name: "probe", Image: image, ImagePullPolicy: "Never", Args: args,
				Resources: generator.KubeResources{Requests: res, Limits: res},
				SecurityContext: generator.KubeContainerSecure{ReadOnlyRootFilesystem: true,
					Capabilities: generator.KubeCapabilites{Drop: []string{"ALL"}}},
			}},
			Volumes: []generator.KubeVolume{},
		}}
	}
	create := func(obj any) error {
		raw, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = k.API.Create(ctx, k.Namespace, raw, kubeapi.CreateOptions{})
		return err
	}
	deny := generator.KubeNetworkPolicy{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy", Metadata: meta("-deny", "policy"),
		Spec: generator.KubeNetworkPolicySpec{
			PodSelector: generator.KubeSelector{MatchLabels: map[string]string{generator.KubeLabelSandbox: name, generator.KubeLabelRole: "probe-denied"}},
			PolicyTypes: []string{"Egress"}, Ingress: []generator.KubePolicyRule{}, Egress: []generator.KubePolicyRule{},
		}}
	if err := create(deny); err != nil {
		return Enforcement{}, err
	}
	if err := create(pod("-server", "probe-server", "python3", "-c", probeServer)); err != nil {
		return Enforcement{}, err
	}
	ip, err := k.podIP(ctx, name+"-server")
	if err != nil {
		return Enforcement{}, err
	}
	var wg sync.WaitGroup
	codes := map[string]int{}
	var errs []error
	var mu sync.Mutex
	for _, role := range []string{"probe-open", "probe-denied"} {
		suffix := strings.TrimPrefix(role, "probe")
		if err := create(pod(suffix, role, "bash", "-c", probeClient, "probe", ip)); err != nil {
			return Enforcement{}, err
		}
		wg.Go(func() {
			st, err := k.waitPod(ctx, name+suffix, func(p podStatus) (bool, error) {
				if c, ok := p.container("probe", false); ok && c.State.Terminated != nil {
					return true, nil // its exit code is the answer, a failed Pod's too
				}
				return false, p.failure()
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			c, _ := st.container("probe", false)
			codes[role] = c.State.Terminated.ExitCode
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Enforcement{}, fmt.Errorf("probing the cluster's network policy: %w", err)
	}
	switch {
	case codes["probe-open"] != 0:
		return Enforcement{Why: fmt.Sprintf("a Pod without a policy could not reach the probe's server at %s:%d (exit %d)", ip, probePort, codes["probe-open"])}, nil
	case codes["probe-denied"] == 0:
		return Enforcement{Known: true, Why: "a Pod under a policy that denies all egress reached another Pod: the CNI does not enforce NetworkPolicy"}, nil
	}
	return Enforcement{Known: true, Enforced: true, Why: "a Pod under a policy that denies all egress could not reach another Pod, which one without a policy reached"}, nil
}

// podIP waits until the Pod name runs with an address, and returns it.
func (k *Cluster) podIP(ctx context.Context, name string) (string, error) {
	p, err := k.waitPod(ctx, name, func(p podStatus) (bool, error) {
		c, ok := p.container("probe", false)
		return ok && c.State.Running != nil && p.Status.PodIP != "", p.failure()
	})
	return p.Status.PodIP, err
}
