//go:build e2ehooks

package sandbox

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/propio/propio-sandbox/internal/ask"
)

// EnvTestRequests names the host socket on which a launch built with the
// tag e2ehooks serves its request handlers to the end-to-end tests:
// POST /v1/requests with an ask.Request is carried out at once, answered
// with {"result": {...}} or {"error": "..."}.
const EnvTestRequests = "PROPIO_SANDBOX_E2E_REQUESTS"

// EnvTestEngineWait shortens, in a launcher built with the tag e2ehooks,
// how long a persistent sandbox's supervisor waits for an engine that went
// away (EngineWait), so that a test sees it give up.
const EnvTestEngineWait = "PROPIO_SANDBOX_E2E_ENGINE_WAIT"

func init() {
	if d, err := time.ParseDuration(os.Getenv(EnvTestEngineWait)); err == nil && d > 0 {
		engineWait = func() time.Duration { return d }
	}
	serveTestRequests = func(handlers map[string]func(context.Context, ask.Request) (map[string]any, error)) func() {
		path := os.Getenv(EnvTestRequests)
		if path == "" {
			return func() {}
		}
		os.Remove(path)
		ln, err := net.Listen("unix", path)
		if err != nil {
			return func() {}
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req ask.Request
			if r.Method != http.MethodPost || r.URL.Path != "/v1/requests" || json.NewDecoder(r.Body).Decode(&req) != nil {
				http.Error(w, "want POST /v1/requests with a request", http.StatusBadRequest)
				return
			}
			answer := map[string]any{}
			if h, ok := handlers[req.Kind]; !ok {
				answer["error"] = "no handler for kind " + req.Kind
			} else if res, err := h(r.Context(), req); err != nil {
				answer["error"] = err.Error()
			} else {
				answer["result"] = res
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(answer)
		})}
		go srv.Serve(ln)
		return func() {
			srv.Close()
			os.Remove(path)
		}
	}
}
