package kubeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client is a connection to one API server with one identity.
type Client struct {
	cfg  *Config
	http *http.Client
}

// New returns a client for c.
func New(c *Config) *Client {
	tr := &http.Transport{TLSClientConfig: c.TLS.Clone(), ForceAttemptHTTP2: true, TLSHandshakeTimeout: 10 * time.Second}
	return &Client{cfg: c, http: &http.Client{Transport: tr}}
}

// Config is the configuration the client was made from.
func (c *Client) Config() *Config { return c.cfg }

// StatusError is an answer of the API server other than a success: its
// Status object's reason and message.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("the API server answered %d %s", e.Code, http.StatusText(e.Code))
	}
	return e.Message
}

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool {
	var s *StatusError
	return errors.As(err, &s) && s.Code == http.StatusNotFound
}

// Do sends a request to the API server and returns the body of a 2xx
// answer; any other answer is a *StatusError. body is JSON, or nil.
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	return c.do(ctx, method, path, query, body, "application/json")
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body []byte, contentType string) ([]byte, error) {
	u := c.cfg.Server + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching the API server %s: %w", c.cfg.Server, unwrapURL(err))
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the API server's answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var st struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(out, &st)
		if st.Message == "" {
			st.Message = strings.TrimSpace(string(out))
			if len(st.Message) > 300 {
				st.Message = st.Message[:300]
			}
			if st.Message != "" {
				st.Message = fmt.Sprintf("the API server answered %d: %s", resp.StatusCode, st.Message)
			}
		}
		return nil, &StatusError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
	}
	return out, nil
}

// unwrapURL drops the *url.Error wrapping, which repeats the request's URL.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Ready asks the API server's /readyz.
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.Do(ctx, http.MethodGet, "/readyz", nil, nil)
	return err
}

// Object is the part of any object a client needs to place it.
type Object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"metadata"`
}

// resources are the kinds a sandbox is made of, by apiVersion/kind: their
// API group's path and their plural.
var resources = map[string]struct{ prefix, plural string }{
	"v1/Pod":                             {"/api/v1", "pods"},
	"v1/Secret":                          {"/api/v1", "secrets"},
	"v1/ConfigMap":                       {"/api/v1", "configmaps"},
	"v1/Service":                         {"/api/v1", "services"},
	"v1/ServiceAccount":                  {"/api/v1", "serviceaccounts"},
	"networking.k8s.io/v1/NetworkPolicy": {"/apis/networking.k8s.io/v1", "networkpolicies"},
	// kubernetes-sigs/agent-sandbox's, served where its CRDs are installed.
	"agents.x-k8s.io/v1alpha1/Sandbox":                    {"/apis/agents.x-k8s.io/v1alpha1", "sandboxes"},
	"extensions.agents.x-k8s.io/v1alpha1/SandboxTemplate": {"/apis/extensions.agents.x-k8s.io/v1alpha1", "sandboxtemplates"},
	"extensions.agents.x-k8s.io/v1alpha1/SandboxClaim":    {"/apis/extensions.agents.x-k8s.io/v1alpha1", "sandboxclaims"},
}

// Served reports whether the API server serves objects of apiVersion and
// kind, by its discovery document of the kind's group and version: a kind
// of a CustomResourceDefinition is served only where it is installed.
func (c *Client) Served(ctx context.Context, apiVersion, kind string) (bool, error) {
	r, ok := resources[apiVersion+"/"+kind]
	if !ok {
		return false, fmt.Errorf("unknown kind %s %s", apiVersion, kind)
	}
	out, err := c.Do(ctx, http.MethodGet, r.prefix, nil, nil)
	if IsNotFound(err) {
		return false, nil // the group or the version is not served at all
	}
	if err != nil {
		return false, fmt.Errorf("asking the API server whether it serves %s %s: %w", apiVersion, kind, err)
	}
	var list struct {
		Resources []struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return false, fmt.Errorf("reading the API server's resources of %s: %w", apiVersion, err)
	}
	for _, res := range list.Resources {
		if res.Name == r.plural && res.Kind == kind {
			return true, nil
		}
	}
	return false, nil
}

// Path is the collection path of an object of apiVersion and kind in
// namespace.
func Path(apiVersion, kind, namespace string) (string, error) {
	r, ok := resources[apiVersion+"/"+kind]
	if !ok {
		return "", fmt.Errorf("unknown kind %s %s", apiVersion, kind)
	}
	return fmt.Sprintf("%s/namespaces/%s/%s", r.prefix, url.PathEscape(namespace), r.plural), nil
}

// CreateOptions are those of a create.
type CreateOptions struct {
	// DryRun asks the API server to validate and admit the object (its
	// server-side dry run) without storing it.
	DryRun bool
}

// Create creates the object obj (JSON) in namespace, or in the object's
// own when it names one; unknown or duplicate fields are errors
// (fieldValidation=Strict). It returns the object as the server stored it.
func (c *Client) Create(ctx context.Context, namespace string, obj []byte, o CreateOptions) ([]byte, error) {
	var head Object
	if err := json.Unmarshal(obj, &head); err != nil {
		return nil, fmt.Errorf("reading the object to create: %w", err)
	}
	if head.Metadata.Namespace != "" {
		namespace = head.Metadata.Namespace
	}
	if namespace == "" {
		namespace = c.cfg.Namespace
	}
	p, err := Path(head.APIVersion, head.Kind, namespace)
	if err != nil {
		return nil, err
	}
	q := url.Values{"fieldValidation": {"Strict"}}
	if o.DryRun {
		q.Set("dryRun", "All")
	}
	out, err := c.Do(ctx, http.MethodPost, p, q, obj)
	if err != nil {
		return nil, fmt.Errorf("creating %s %s in namespace %s: %w", head.Kind, head.Metadata.Name, namespace, err)
	}
	return out, nil
}

// Patch patches the object at path (its collection's path and its name)
// with a patch of contentType (application/merge-patch+json, for one).
func (c *Client) Patch(ctx context.Context, path, contentType string, patch []byte) ([]byte, error) {
	return c.do(ctx, http.MethodPatch, path, nil, patch, contentType)
}

// Stream sends a GET and returns the body of a 2xx answer as it comes (a
// log followed); the caller closes it.
func (c *Client) Stream(ctx context.Context, path string, query url.Values) (io.ReadCloser, error) {
	u := c.cfg.Server + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reaching the API server %s: %w", c.cfg.Server, unwrapURL(err))
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var st struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(b, &st)
		return nil, &StatusError{Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
	}
	return resp.Body, nil
}
