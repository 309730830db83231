package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/kubeapi"
)

// The Kubernetes tests' gate. PROPIO_KUBECONFIG names the kubeconfig of a
// test cluster (e2e/kube-cluster.sh start prints it); without it the
// tests skip, saying so, even under PROPIO_E2E=require: a cluster is
// there only where one was started, and .ci/run, which starts one, sets
// it. When it is set, the cluster must answer: under PROPIO_E2E=require a
// cluster that does not is a failure. PROPIO_KUBE_WAIT (a Go duration,
// default 0) is how long to wait for it to become ready first: CI starts
// the cluster in the background while the other tests run. A file next to
// the kubeconfig named KUBECONFIG.failed (the start failed; it says why)
// ends the wait at once.

// Kube returns a client of the test cluster as its admin, and the path of
// its kubeconfig, once the API server is ready and the default namespace
// can take Pods (its service account exists).
func Kube(tb testing.TB) (*kubeapi.Client, string) {
	tb.Helper()
	file := os.Getenv("PROPIO_KUBECONFIG")
	if file == "" {
		tb.Skip("skipping: no Kubernetes cluster: PROPIO_KUBECONFIG is not set " +
			"(bash e2e/kube-cluster.sh start starts one and prints the kubeconfig to set it to)")
	}
	wait := time.Duration(0)
	if w := os.Getenv("PROPIO_KUBE_WAIT"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			tb.Fatalf("PROPIO_KUBE_WAIT=%q: %v", w, err)
		}
		wait = d
	}
	c, err := kubeReady(file, wait)
	if err != nil {
		skipOrFail(tb, fmt.Sprintf("the Kubernetes cluster of PROPIO_KUBECONFIG=%s is not ready: %v", file, err))
	}
	return c, file
}

// kubeReady waits, at most wait (and at least one try), for the cluster
// of the kubeconfig file to be ready.
func kubeReady(file string, wait time.Duration) (*kubeapi.Client, error) {
	deadline := time.Now().Add(wait)
	for {
		c, err := kubeTry(file)
		if err == nil {
			return c, nil
		}
		if b, ferr := os.ReadFile(file + ".failed"); ferr == nil {
			return nil, fmt.Errorf("its start failed: %s", strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			if wait > 0 {
				return nil, fmt.Errorf("not within %v: %w", wait, err)
			}
			return nil, err
		}
		time.Sleep(time.Second) // the cluster's start is not an event this process can await
	}
}

func kubeTry(file string) (*kubeapi.Client, error) {
	cfg, err := kubeapi.LoadConfig(file, "")
	if err != nil {
		return nil, err
	}
	c := kubeapi.New(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ready(ctx); err != nil {
		return nil, err
	}
	if _, err := c.Do(ctx, "GET", "/api/v1/namespaces/default/serviceaccounts/default", nil, nil); err != nil {
		return nil, fmt.Errorf("the default namespace has no service account yet: %w", err)
	}
	return c, nil
}
