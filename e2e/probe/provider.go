package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
)

// provider is the stand-in for an LLM provider that speaks OpenAI's
// Responses API (POST .../responses, answered as server-sent events), as a
// real agent CLI calls it. It runs until killed. A turn without a tool's
// output in its input is answered with one call of the agent's shell tool,
// running cmd; a turn that carries the tool's output is answered with a final
// message that quotes the output's last line. Every other request gets a 404.
//
// It prints "serving provider" once listening on :80 (and on :443, over
// TLS, given /certs/server.pem and /certs/server.key), then one line per
// event: "request METHOD PATH from ADDR", "authorization AUTH" (quoted),
// "tool call TOOL CALLID", "tool output CALLID: OUTPUT" (quoted), "final
// message".
func provider(cmd string) {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", httpPort))
	check(err)
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		say("request %s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		say("authorization %q", r.Header.Get("Authorization"))
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/responses") {
			http.NotFound(w, r)
			return
		}
		var req responsesRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := fmt.Sprintf("resp_%d", calls.Add(1))
		var events []map[string]any
		if out, callID, ok := req.toolOutput(); ok {
			say("tool output %s: %q", callID, out)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			events = append(events, messageItem(id, "done: "+lines[len(lines)-1]))
			say("final message")
		} else {
			tool, args := req.shellCall(cmd)
			callID := "call_" + id
			events = append(events, map[string]any{"type": "response.output_item.done", "item": map[string]any{
				"type": "function_call", "call_id": callID, "name": tool, "arguments": args,
			}})
			say("tool call %s %s", tool, callID)
		}
		writeEvents(w, id, events)
	})
	if cert, err := tls.LoadX509KeyPair("/certs/server.pem", "/certs/server.key"); err == nil {
		tln, err := net.Listen("tcp", fmt.Sprintf(":%d", httpsPort))
		check(err)
		srv := newServer(h)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
		go func() { fail(srv.ServeTLS(tln, "", "")) }()
	}
	say("serving provider")
	fail(newServer(h).Serve(ln))
}

// responsesRequest is what provider reads of a request: the tools offered
// and the input items.
type responsesRequest struct {
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Input []struct {
		Type   string          `json:"type"`
		CallID string          `json:"call_id"`
		Output json.RawMessage `json:"output"`
	} `json:"input"`
}

// toolOutput is the output of the last function call in the input, as text.
func (r responsesRequest) toolOutput() (out, callID string, ok bool) {
	for _, in := range r.Input {
		if in.Type != "function_call_output" {
			continue
		}
		out, callID, ok = "", in.CallID, true
		if json.Unmarshal(in.Output, &out) == nil {
			continue
		}
		// Or a list of content items, each with its text.
		var parts []struct {
			Text string `json:"text"`
		}
		json.Unmarshal(in.Output, &parts)
		for _, p := range parts {
			out += p.Text
		}
	}
	return out, callID, ok
}

// shellCall is a call of the shell tool the agent offers that runs cmd: its
// name and its arguments (a JSON string), for the tool shapes Codex has had.
func (r responsesRequest) shellCall(cmd string) (string, string) {
	offered := map[string]bool{}
	for _, t := range r.Tools {
		offered[t.Name] = true
	}
	var args any
	tool := "exec_command"
	switch {
	case offered["exec_command"]:
		args = map[string]any{"cmd": cmd, "login": false}
	case offered["shell_command"]:
		tool, args = "shell_command", map[string]any{"command": cmd}
	default:
		tool, args = "shell", map[string]any{"command": []string{"bash", "-c", cmd}}
	}
	b, _ := json.Marshal(args)
	return tool, string(b)
}

func messageItem(id, text string) map[string]any {
	return map[string]any{"type": "response.output_item.done", "item": map[string]any{
		"type": "message", "role": "assistant", "id": "msg_" + id,
		"content": []map[string]any{{"type": "output_text", "text": text}},
	}}
}

// writeEvents sends a response's events between response.created and
// response.completed.
func writeEvents(w http.ResponseWriter, id string, events []map[string]any) {
	all := append([]map[string]any{{"type": "response.created", "response": map[string]any{"id": id}}}, events...)
	all = append(all, map[string]any{"type": "response.completed", "response": map[string]any{
		"id":    id,
		"usage": map[string]any{"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
	}})
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range all {
		b, _ := json.Marshal(e)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e["type"], b)
	}
}
