package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// Streams are a run's standard streams; In nil: no input.
type Streams struct {
	In  io.Reader
	Out io.Writer
}

// RunSpec is one run of a sandbox on the cluster.
type RunSpec struct {
	Objects *generator.KubeObjects
	// Env gives the values of the passed variables.
	Env func(string) (string, bool)
	// Workspace is a tar stream of the workspace, unpacked into its volume
	// by the Pod's init container before the sandbox starts.
	Workspace io.Reader
	Streams   Streams
	// Started, when set, is called once the sandbox's container runs.
	Started func()
	// TTY gives the sandbox's container a terminal, of Size: its input
	// goes there, and its output (the terminal's) comes back on
	// Streams.Out.
	TTY  bool
	Size *kubeapi.TermSize
	// Resize gives the terminal's later sizes (the launcher's window
	// resized).
	Resize <-chan kubeapi.TermSize
	// Warn, when set, is told what the run could not check (it goes on).
	Warn func(string)
	// WorkspaceOut, when set, receives a tar stream of the workspace as the
	// command left it, read in the Pod's keeper container
	// (generator.KubeKeeperContainer) once the command has ended, before
	// the Pod is removed.
	WorkspaceOut io.Writer
	// GatewayLog, when set and the objects have an allowlist's gateway,
	// receives the gateway's decision log (the lines of its file, which is
	// in the gateway's Pod) from its start and as it grows: the command
	// GatewayLogFollow (generator.KubeObjects.GatewayLogFollow) runs in
	// the gateway's container from the sandbox's start until its end, and
	// then until the log settles, before the Pods are removed.
	GatewayLog       io.Writer
	GatewayLogFollow []string
}

// ErrNotEnforced: the sandbox's NetworkPolicy denies its egress, and its
// Pod still reached the API server's Service after policyWait: the
// cluster's CNI does not enforce NetworkPolicy.
var ErrNotEnforced = errors.New("the cluster does not enforce the sandbox's NetworkPolicy")

// ErrWorkspaceOut: the workspace could not be copied out of the Pod.
var ErrWorkspaceOut = errors.New("copying the workspace out of the pod failed")

// ErrDeadline: the Pod's activeDeadlineSeconds (the profile's timeout)
// ended the sandbox.
var ErrDeadline = errors.New("the sandbox's timeout (activeDeadlineSeconds) ended it")

// poll is how often a run looks at its Pod: the kubelet's progress is
// not an event this client subscribes to.
const poll = 200 * time.Millisecond

// Run creates the sandbox's objects, copies the workspace in, runs the
// sandbox with its output (standard output and error, in the order the
// node logged them, on Streams.Out: the API gives them as one stream) and
// its input, and returns its exit code. Everything it made is removed
// however it ends: the end of ctx (a signal), an error, the end of the
// command. A launcher killed outright leaves objects that Remove finds by
// the sandbox's label.
func (k *Cluster) Run(ctx context.Context, s RunSpec) (code int, err error) {
	if s.TTY {
		objs := *s.Objects
		objs.Pod.Spec.Containers = slices.Clone(objs.Pod.Spec.Containers)
		for i := range objs.Pod.Spec.Containers {
			if objs.Pod.Spec.Containers[i].Name == "sandbox" {
				objs.Pod.Spec.Containers[i].TTY = true
			}
		}
		s.Objects = &objs
	}
	made, err := k.Create(ctx, s.Objects, s.Env)
	if err != nil {
		return -1, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := k.Remove(rctx, made.Pod); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if gw := s.Objects.Gateway; gw != nil && s.GatewayLog != nil && len(s.GatewayLogFollow) > 0 {
		// Deferred after the removal, so run before it: the log is all in
		// before the gateway goes.
		defer k.followGatewayLog(ctx, gw.Metadata.Name, s.GatewayLogFollow, s.GatewayLog, s.Warn)()
	}
	pod := made.Pod
	if _, err := k.waitPod(ctx, pod, func(p podStatus) (bool, error) {
		st, ok := p.container(generator.KubeCopyContainer, true)
		return ok && st.State.Running != nil, p.failure()
	}); err != nil {
		return -1, err
	}
	if denied(s.Objects) {
		if err := k.awaitPolicy(ctx, pod, s.Warn); err != nil {
			return -1, err
		}
	}
	copyOpts := kubeapi.StreamOptions{Container: generator.KubeCopyContainer, Stdin: true, Stdout: true, Stderr: true}
	var copyErr limited
	if err := k.API.Attach(ctx, k.Namespace, pod, copyOpts, s.Workspace, io.Discard, &copyErr); err != nil {
		return -1, fmt.Errorf("copying the workspace into pod %s: %w", pod, err)
	}
	if _, err := k.waitPod(ctx, pod, func(p podStatus) (bool, error) {
		st, ok := p.container("sandbox", false)
		return ok && (st.State.Running != nil || st.State.Terminated != nil), p.failure()
	}); err != nil {
		if copyErr.n > 0 {
			err = fmt.Errorf("%w (the copy said: %s)", err, copyErr.String())
		}
		return -1, err
	}
	if s.Started != nil {
		s.Started()
	}
	if s.Streams.In != nil {
		go func() {
			// Input goes in while the command runs; its end closes the
			// command's standard input. An attach to a container that has
			// ended already fails, and the input is not wanted then.
			_ = k.API.Attach(ctx, k.Namespace, pod, kubeapi.StreamOptions{Container: "sandbox", Stdin: true, TTY: s.TTY, Size: s.Size, Resize: s.Resize}, s.Streams.In, nil, nil)
		}()
	}
	if s.Streams.Out != nil {
		q := url.Values{"container": {"sandbox"}, "follow": {"true"}}
		logs, err := k.API.Stream(ctx, "/api/v1/namespaces/"+url.PathEscape(k.Namespace)+"/pods/"+url.PathEscape(pod)+"/log", q)
		if err != nil {
			return -1, fmt.Errorf("following the sandbox's output: %w", err)
		}
		_, err = io.Copy(s.Streams.Out, logs)
		logs.Close()
		if err != nil && ctx.Err() == nil {
			return -1, fmt.Errorf("following the sandbox's output: %w", err)
		}
	}
	final, err := k.waitPod(ctx, pod, func(p podStatus) (bool, error) {
		st, ok := p.container("sandbox", false)
		return ok && st.State.Terminated != nil, nil
	})
	if err != nil {
		return -1, err
	}
	st, _ := final.container("sandbox", false)
	if final.Status.Reason == "DeadlineExceeded" {
		return st.State.Terminated.ExitCode, ErrDeadline
	}
	code = st.State.Terminated.ExitCode
	if s.WorkspaceOut != nil {
		if err := k.copyOut(ctx, pod, s.Objects, s.WorkspaceOut); err != nil {
			return code, err
		}
	}
	return code, nil
}

// Bounds of the gateway's log's end: the settling of gateway-log
// (decisionlog.SettleMax) and the stream's own end; less when the run was
// ended by its context (a signal), which is not kept waiting.
const (
	logDrain          = 10 * time.Second
	logDrainCancelled = 2 * time.Second
)

// followGatewayLog runs command (gateway-log) in the gateway's container
// of Pod pod, its output to w, and returns how to end it: its standard
// input closed, it copies what the gateway writes until the log settles,
// and ends; one that does not end within logDrain is cut. What went wrong
// is said to warn: the run goes on without the rest of the log.
func (k *Cluster) followGatewayLog(ctx context.Context, pod string, command []string, w io.Writer, warn func(string)) (stop func()) {
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	in, end := io.Pipe()
	done := make(chan error, 1)
	var stderr limited
	go func() {
		o := kubeapi.StreamOptions{Container: generator.GatewayService, Stdin: true, Stdout: true, Stderr: true, Command: command}
		done <- k.API.Exec(lctx, k.Namespace, pod, o, in, w, &stderr)
	}()
	return func() {
		defer cancel()
		end.Close()
		bound := logDrain
		if ctx.Err() != nil {
			bound = logDrainCancelled
		}
		var err error
		select {
		case err = <-done:
		case <-time.After(bound):
			cancel()
			<-done
			err = fmt.Errorf("it did not end within %v of the sandbox's", bound)
		}
		if err != nil && warn != nil {
			if stderr.n > 0 {
				err = fmt.Errorf("%w (%s)", err, strings.TrimSpace(stderr.String()))
			}
			warn(fmt.Sprintf("the gateway's decision log may miss decisions: following it in pod %s: %v", pod, err))
		}
	}
}

// copyOut writes a tar stream of the workspace's volume to w, from the
// Pod's keeper container.
func (k *Cluster) copyOut(ctx context.Context, pod string, objs *generator.KubeObjects, w io.Writer) error {
	at := ""
	for _, c := range objs.Pod.Spec.Containers {
		if c.Name == generator.KubeKeeperContainer && len(c.VolumeMounts) > 0 {
			at = c.VolumeMounts[0].MountPath
		}
	}
	if at == "" {
		return fmt.Errorf("%w: pod %s has no %s container", ErrWorkspaceOut, pod, generator.KubeKeeperContainer)
	}
	var stderr limited
	o := kubeapi.StreamOptions{Container: generator.KubeKeeperContainer, Stdout: true, Stderr: true, Command: []string{"tar", "-c", "-f", "-", "-C", at, "."}}
	if err := k.API.Exec(ctx, k.Namespace, pod, o, nil, w, &stderr); err != nil {
		if stderr.n > 0 {
			return fmt.Errorf("%w: %v (tar said: %s)", ErrWorkspaceOut, err, strings.TrimSpace(stderr.String()))
		}
		return fmt.Errorf("%w: %v", ErrWorkspaceOut, err)
	}
	return nil
}

// limited keeps the first 4 KiB written to it.
type limited struct {
	b []byte
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	l.n += len(p)
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limited) String() string { return string(l.b) }

type podStatus struct {
	Status struct {
		Phase                 string            `json:"phase"`
		PodIP                 string            `json:"podIP"`
		Reason                string            `json:"reason"`
		Message               string            `json:"message"`
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
		Conditions            []struct {
			Type    string `json:"type"`
			Status  string `json:"status"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"conditions"`
	} `json:"status"`
}

type containerStatus struct {
	Name  string `json:"name"`
	State struct {
		Running *struct{} `json:"running"`
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
		Terminated *struct {
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
			Message  string `json:"message"`
		} `json:"terminated"`
	} `json:"state"`
}

func (p podStatus) container(name string, init bool) (containerStatus, bool) {
	list := p.Status.ContainerStatuses
	if init {
		list = p.Status.InitContainerStatuses
	}
	for _, c := range list {
		if c.Name == name {
			return c, true
		}
	}
	return containerStatus{}, false
}

// stuck are the reasons a container waits that waiting does not end.
var stuck = map[string]bool{
	"ErrImageNeverPull": true, "InvalidImageName": true, "CreateContainerConfigError": true,
	"CreateContainerError": true, "RunContainerError": true, "ImageInspectError": true,
}

// failure says why the Pod will not get further, or nil.
func (p podStatus) failure() error {
	for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if w := c.State.Waiting; w != nil && stuck[w.Reason] {
			return fmt.Errorf("container %s cannot start: %s: %s", c.Name, w.Reason, w.Message)
		}
		if t := c.State.Terminated; t != nil && c.Name == generator.KubeCopyContainer && t.ExitCode != 0 {
			return fmt.Errorf("the workspace's copy failed (exit status %d): %s", t.ExitCode, t.Message)
		}
	}
	if p.Status.Phase == "Failed" {
		return fmt.Errorf("the pod failed: %s %s", p.Status.Reason, p.Status.Message)
	}
	return nil
}

// unschedulable is why no node takes the Pod, or "".
func (p podStatus) unschedulable() string {
	for _, c := range p.Status.Conditions {
		if c.Type == "PodScheduled" && c.Status == "False" && c.Reason == "Unschedulable" {
			return c.Message
		}
	}
	return ""
}

// unschedulableFor is how long a Pod may wait for a node (the scheduler
// retries as others end) before the run gives up.
const unschedulableFor = time.Minute

// waitPod looks at the Pod until done says it is there, or fails.
func (k *Cluster) waitPod(ctx context.Context, name string, done func(podStatus) (bool, error)) (podStatus, error) {
	path := "/api/v1/namespaces/" + url.PathEscape(k.Namespace) + "/pods/" + url.PathEscape(name)
	var since time.Time // when the Pod was first seen with no node for it
	for {
		raw, err := k.API.Do(ctx, http.MethodGet, path, nil, nil)
		if err != nil {
			if ctx.Err() != nil {
				return podStatus{}, ctx.Err()
			}
			return podStatus{}, fmt.Errorf("looking at pod %s: %w", name, err)
		}
		var p podStatus
		if err := json.Unmarshal(raw, &p); err != nil {
			return podStatus{}, fmt.Errorf("looking at pod %s: %w", name, err)
		}
		ok, err := done(p)
		if ok || err != nil {
			return p, err
		}
		if why := p.unschedulable(); why == "" {
			since = time.Time{}
		} else if since.IsZero() {
			since = time.Now()
		} else if time.Since(since) > unschedulableFor {
			return p, fmt.Errorf("no node can take pod %s: %s", name, why)
		}
		select {
		case <-ctx.Done():
			return podStatus{}, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// denied reports whether a policy of objs keeps the sandbox from the API
// server's Service: it denies it all egress, or allows it only to Pods
// (an allowlist's, to its gateway).
func denied(objs *generator.KubeObjects) bool {
	for _, p := range objs.Policies {
		if p.Spec.PodSelector.MatchLabels[generator.KubeLabelRole] == "gateway" || !slices.Contains(p.Spec.PolicyTypes, "Egress") {
			continue
		}
		if !slices.ContainsFunc(p.Spec.Egress, func(r generator.KubePolicyRule) bool { return len(r.To) == 0 }) {
			return true
		}
	}
	return false
}

// policyWait bounds the wait for the CNI to enforce the sandbox's policy.
const policyWait = 30 * time.Second

// policyProbe tries, from inside the Pod (its network namespace), a TCP
// connection to the API server's Service, which a policy that denies
// egress keeps it from: exit 0 when it connected.
var policyProbe = []string{"timeout", "2", "bash", "-c", `exec 3<>"/dev/tcp/$KUBERNETES_SERVICE_HOST/$KUBERNETES_SERVICE_PORT"`}

// awaitPolicy waits, before the sandbox's command can start (its
// workspace not copied in yet), until its Pod can no longer reach the API
// server's Service: a NetworkPolicy holds once the CNI's agent has seen
// the Pod. The probe runs in the copy container; one that cannot run
// there (no bash or timeout in the image) is said to warn, and the run
// goes on. A Pod that still connects after policyWait is ErrNotEnforced.
func (k *Cluster) awaitPolicy(ctx context.Context, pod string, warn func(string)) error {
	deadline := time.Now().Add(policyWait)
	o := kubeapi.StreamOptions{Container: generator.KubeCopyContainer, Stdout: true, Stderr: true, Command: policyProbe}
	for {
		var out limited
		err := k.API.Exec(ctx, k.Namespace, pod, o, nil, &out, &out)
		var exit *kubeapi.ExitError
		switch {
		case errors.As(err, &exit) && exit.Code != 127 && exit.Code != 126:
			return nil // not reached: the policy holds
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if warn != nil {
				warn(fmt.Sprintf("could not check that the cluster enforces the sandbox's NetworkPolicy before its command starts (the probe needs bash and timeout in the image): %v %s", err, strings.TrimSpace(out.String())))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: pod %s still reached the API server's Service %v after it was made", ErrNotEnforced, pod, policyWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}
