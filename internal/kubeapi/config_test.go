package kubeapi

import (
	"context"
	"encoding/base64"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, dir, text string) string {
	t.Helper()
	f := filepath.Join(dir, "config")
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLoadConfig reads a kubeconfig as kubectl does: the current context
// or the one named, its cluster and user, a CA from a file relative to the
// kubeconfig or from its data, a token from a file, and the namespace.
func TestLoadConfig(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok-123" {
			http.Error(w, `{"kind":"Status","reason":"Unauthorized","message":"who are you"}`, http.StatusUnauthorized)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	file := writeConfig(t, dir, `apiVersion: v1
kind: Config
current-context: a
clusters:
- name: c1
  cluster: {server: "`+srv.URL+`/", certificate-authority: ca.crt}
- name: c2
  cluster: {server: "`+srv.URL+`", certificate-authority-data: `+base64.StdEncoding.EncodeToString(ca)+`}
users:
- name: u1
  user: {tokenFile: token}
- name: u2
  user: {token: wrong}
contexts:
- name: a
  context: {cluster: c1, user: u1, namespace: team}
- name: b
  context: {cluster: c2, user: u2}
`)
	a, err := LoadConfig(file, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.Context != "a" || a.Namespace != "team" || a.Server != srv.URL || a.Token != "tok-123" {
		t.Errorf("context a: %+v", a)
	}
	if err := New(a).Ready(context.Background()); err != nil {
		t.Errorf("context a: %v", err)
	}
	b, err := LoadConfig(file, "b")
	if err != nil {
		t.Fatal(err)
	}
	if b.Namespace != "default" {
		t.Errorf("context b: namespace %q, want default", b.Namespace)
	}
	err = New(b).Ready(context.Background())
	var st *StatusError
	if !asStatus(err, &st) || st.Code != 401 || st.Message != "who are you" {
		t.Errorf("context b (a wrong token): %v, want the server's 401 and its message", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the error shows the token: %v", err)
	}
	if _, err := LoadConfig(file, "nope"); err == nil || !strings.Contains(err.Error(), `no context "nope"`) || !strings.Contains(err.Error(), file) {
		t.Errorf("a missing context: %v", err)
	}
}

func asStatus(err error, st **StatusError) bool {
	s, ok := err.(*StatusError)
	*st = s
	return ok
}

// TestLoadConfigRefusesExec: credentials from a plugin are not supported,
// and saying so beats failing later with a 401.
func TestLoadConfigRefusesExec(t *testing.T) {
	file := writeConfig(t, t.TempDir(), `current-context: a
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {command: aws}}}]
contexts: [{name: a, context: {cluster: c, user: u}}]
`)
	if _, err := LoadConfig(file, ""); err == nil || !strings.Contains(err.Error(), "exec") {
		t.Errorf("exec credentials: %v, want a refusal", err)
	}
}

func TestPath(t *testing.T) {
	for kind, want := range map[string]string{
		"v1/Pod":                             "/api/v1/namespaces/ns/pods",
		"networking.k8s.io/v1/NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies",
	} {
		av, k, _ := strings.Cut(kind, "/")
		if strings.Count(kind, "/") == 2 {
			i := strings.LastIndex(kind, "/")
			av, k = kind[:i], kind[i+1:]
		}
		got, err := Path(av, k, "ns")
		if err != nil || got != want {
			t.Errorf("Path(%s) = %q, %v; want %q", kind, got, err, want)
		}
	}
	if _, err := Path("v1", "Node", "ns"); err == nil {
		t.Error("an unknown kind has a path")
	}
}
