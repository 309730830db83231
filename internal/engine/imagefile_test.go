package engine_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/engine"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestImageFile reads files out of images without starting a container:
// the first of the paths that exists, through a link (two, here: the hashed
// name to the .pem, that to the certificate), and nothing when none does;
// no container is left.
func TestImageFile(t *testing.T) {
	ctx := context.Background()
	eng := connectEngine(t)
	const agent = "propio-sandbox/agent:latest"
	if _, err := testenv.Docker("image", "inspect", agent); err != nil {
		if os.Getenv("PROPIO_E2E") == "require" {
			t.Fatalf("the agent image is missing (build it with `propio-sandbox build`): %v", err)
		}
		t.Skipf("the agent image is missing: %v", err)
	}
	path, data, err := eng.ImageFile(ctx, agent, []string{"/no/such/file", "/etc/ssl/certs/002c0b4f.0"}, 1<<20)
	if err != nil || path != "/etc/ssl/certs/GlobalSign_Root_R46.pem" && !strings.HasPrefix(path, "/usr/share/ca-certificates/") || !bytes.HasPrefix(data, []byte("-----BEGIN CERTIFICATE-----")) {
		t.Errorf("ImageFile through links: %q, %d bytes, %v", path, len(data), err)
	}
	path, data, err = eng.ImageFile(ctx, agent, []string{"/etc/ssl/certs/ca-certificates.crt"}, 1<<20)
	if err != nil || path != "/etc/ssl/certs/ca-certificates.crt" || bytes.Count(data, []byte("BEGIN CERTIFICATE")) < 100 {
		t.Errorf("ImageFile of the store: %q, %d bytes, %v", path, len(data), err)
	}
	if _, _, err := eng.ImageFile(ctx, agent, []string{"/etc/ssl/certs/ca-certificates.crt"}, 1000); err == nil || !strings.Contains(err.Error(), "larger than 1000 bytes") {
		t.Errorf("ImageFile past its bound: %v", err)
	}
	if path, data, err := eng.ImageFile(ctx, testenv.ProbeImage, []string{"/etc/ssl/certs/ca-certificates.crt"}, 1<<20); err != nil || path != "" || data != nil {
		t.Errorf("ImageFile of a scratch image: %q, %d bytes, %v; want nothing", path, len(data), err)
	}
	id, err := eng.ImageID(ctx, agent)
	if err != nil || !strings.HasPrefix(id, "sha256:") {
		t.Errorf("ImageID: %q, %v", id, err)
	}
	if out, _ := testenv.Docker("ps", "-aq", "--filter", "label="+engine.LabelImage+"=file-probe"); strings.TrimSpace(out) != "" {
		t.Errorf("containers left: %s", out)
	}
}
