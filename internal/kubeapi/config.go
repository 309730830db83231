// Package kubeapi talks to a Kubernetes API server over its REST API, with
// the credentials of a kubeconfig: the server, its CA, and a client
// certificate or a bearer token. It needs no client-go: what a sandbox
// creates is a handful of objects, which the generator renders.
//
// It knows nothing of profiles or sandboxes, and prints nothing.
package kubeapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is what a client needs of a kubeconfig's context.
type Config struct {
	// File is the kubeconfig it was read from; Context the context's name.
	File, Context string
	Server        string
	// Namespace is the context's namespace, "default" when it names none.
	Namespace string
	TLS       *tls.Config
	// Token is a bearer token, "" when the client authenticates with a
	// certificate.
	Token string
}

// kubeconfig is the part of the kubeconfig format read here.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Clusters       []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			TLSServerName            string `yaml:"tls-server-name"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			ClientCertificate     string         `yaml:"client-certificate"`
			ClientCertificateData string         `yaml:"client-certificate-data"`
			ClientKey             string         `yaml:"client-key"`
			ClientKeyData         string         `yaml:"client-key-data"`
			Token                 string         `yaml:"token"`
			TokenFile             string         `yaml:"tokenFile"`
			Exec                  map[string]any `yaml:"exec"`
			AuthProvider          map[string]any `yaml:"auth-provider"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster   string `yaml:"cluster"`
			User      string `yaml:"user"`
			Namespace string `yaml:"namespace"`
		} `yaml:"context"`
	} `yaml:"contexts"`
}

// DefaultFile is the kubeconfig kubectl reads: the first file of
// $KUBECONFIG, else ~/.kube/config.
func DefaultFile() string {
	if list := os.Getenv("KUBECONFIG"); list != "" {
		for _, f := range filepath.SplitList(list) {
			if f != "" {
				return f
			}
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".kube", "config")
}

// LoadConfig reads the kubeconfig file and the context named (its current
// context when ""). Relative paths in it are relative to its directory, as
// kubectl reads them.
func LoadConfig(file, context string) (*Config, error) {
	if file == "" {
		file = DefaultFile()
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(raw, &kc); err != nil {
		return nil, fmt.Errorf("reading kubeconfig %s: %w", file, err)
	}
	c, err := kc.config(file, context)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", file, err)
	}
	return c, nil
}

func (kc *kubeconfig) config(file, name string) (*Config, error) {
	if name == "" {
		name = kc.CurrentContext
	}
	if name == "" {
		return nil, errors.New("it has no current-context: name one with --context")
	}
	dir := filepath.Dir(file)
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c := &Config{File: file, Context: name, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}
	var cluster, user string
	found := false
	for _, x := range kc.Contexts {
		if x.Name == name {
			cluster, user, c.Namespace, found = x.Context.Cluster, x.Context.User, x.Context.Namespace, true
		}
	}
	if !found {
		return nil, fmt.Errorf("no context %q in it", name)
	}
	if c.Namespace == "" {
		c.Namespace = "default"
	}
	found = false
	for _, x := range kc.Clusters {
		if x.Name != cluster {
			continue
		}
		found = true
		c.Server = strings.TrimRight(x.Cluster.Server, "/")
		c.TLS.ServerName = x.Cluster.TLSServerName
		c.TLS.InsecureSkipVerify = x.Cluster.InsecureSkipTLSVerify
		ca, err := fileOrData(abs(x.Cluster.CertificateAuthority), x.Cluster.CertificateAuthorityData)
		if err != nil {
			return nil, fmt.Errorf("cluster %q: certificate-authority: %w", cluster, err)
		}
		if ca != nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("cluster %q: certificate-authority holds no PEM certificate", cluster)
			}
			c.TLS.RootCAs = pool
		}
	}
	if !found {
		return nil, fmt.Errorf("context %q: no cluster %q in it", name, cluster)
	}
	if c.Server == "" {
		return nil, fmt.Errorf("cluster %q has no server", cluster)
	}
	for _, x := range kc.Users {
		if x.Name != user {
			continue
		}
		u := x.User
		if u.Exec != nil || u.AuthProvider != nil {
			return nil, fmt.Errorf("user %q: exec and auth-provider credentials are not supported: use a client certificate or a token", user)
		}
		cert, err := fileOrData(abs(u.ClientCertificate), u.ClientCertificateData)
		if err != nil {
			return nil, fmt.Errorf("user %q: client-certificate: %w", user, err)
		}
		key, err := fileOrData(abs(u.ClientKey), u.ClientKeyData)
		if err != nil {
			return nil, fmt.Errorf("user %q: client-key: %w", user, err)
		}
		if cert != nil || key != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("user %q: client certificate and key: %w", user, err)
			}
			c.TLS.Certificates = []tls.Certificate{pair}
		}
		c.Token = u.Token
		if u.TokenFile != "" && c.Token == "" {
			t, err := os.ReadFile(abs(u.TokenFile))
			if err != nil {
				return nil, fmt.Errorf("user %q: tokenFile: %w", user, err)
			}
			c.Token = strings.TrimSpace(string(t))
		}
	}
	return c, nil
}

// fileOrData returns the bytes of a kubeconfig's *-data field (base64), or
// of the file its sibling names; nil when neither is set.
func fileOrData(file, data string) ([]byte, error) {
	if data != "" {
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			return nil, fmt.Errorf("not base64: %w", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	return os.ReadFile(file)
}
