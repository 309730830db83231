package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKubeReadyStopsAtAFailedStart: a start that failed (KUBECONFIG.failed)
// ends the wait for the cluster at once, with its reason.
func TestKubeReadyStopsAtAFailedStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := os.WriteFile(file+".failed", []byte("e2e/kube-cluster.sh start failed (1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := kubeReady(file, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "its start failed: e2e/kube-cluster.sh start failed (1)") {
		t.Fatalf("kubeReady: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("kubeReady took %v to see the failed start", d)
	}
}
