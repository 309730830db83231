package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/websocket"
)

// The channels of the Kubernetes streaming protocol over WebSocket
// (v5.channel.k8s.io): each binary message starts with its channel's byte.
const (
	chanStdin  = 0
	chanStdout = 1
	chanStderr = 2
	chanError  = 3
	chanResize = 4
	chanClose  = 255 // v5: [255, channel] closes that channel (stdin's end)
)

// StreamOptions say which of a container's streams to open.
type StreamOptions struct {
	Container             string
	Stdin, Stdout, Stderr bool
	TTY                   bool
	// Size, with TTY, is the terminal's size, sent as the stream opens;
	// each size Resize gives later is sent as it comes.
	Size    *TermSize
	Resize  <-chan TermSize
	Command []string // exec only
}

// TermSize is a terminal's size in characters.
type TermSize struct {
	Width  uint16 `json:"Width"`
	Height uint16 `json:"Height"`
}

// ExitError is a command's exit status other than 0, as the API server
// reports it on the error channel of an exec.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Attach connects to the streams of a running container of a Pod (its
// attach subresource), copies stdin to it (its end closes the container's
// standard input) and its output to stdout and stderr, until the
// container's streams end.
func (c *Client) Attach(ctx context.Context, namespace, pod string, o StreamOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	return c.stream(ctx, namespace, pod, "attach", o, stdin, stdout, stderr)
}

// Exec runs a command in a container of a Pod (its exec subresource), with
// the streams as Attach; a non-zero exit is an *ExitError.
func (c *Client) Exec(ctx context.Context, namespace, pod string, o StreamOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	return c.stream(ctx, namespace, pod, "exec", o, stdin, stdout, stderr)
}

func (c *Client) stream(ctx context.Context, namespace, pod, sub string, o StreamOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	q := url.Values{}
	if o.Container != "" {
		q.Set("container", o.Container)
	}
	for k, on := range map[string]bool{"stdin": o.Stdin && stdin != nil, "stdout": o.Stdout, "stderr": o.Stderr && !o.TTY, "tty": o.TTY} {
		if on {
			q.Set(k, "true")
		}
	}
	for _, a := range o.Command {
		q.Add("command", a)
	}
	server, err := url.Parse(c.cfg.Server)
	if err != nil {
		return fmt.Errorf("the API server's address %q: %w", c.cfg.Server, err)
	}
	scheme := "wss"
	if server.Scheme == "http" {
		scheme = "ws"
	}
	loc := &url.URL{Scheme: scheme, Host: server.Host, Path: strings.TrimRight(server.Path, "/") +
		fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/%s", url.PathEscape(namespace), url.PathEscape(pod), sub), RawQuery: q.Encode()}
	cfg, err := websocket.NewConfig(loc.String(), server.Scheme+"://"+server.Host)
	if err != nil {
		return err
	}
	cfg.Protocol = []string{"v5.channel.k8s.io"}
	// HTTP/1.1 only: the upgrade to WebSocket is an HTTP/1.1 request
	// (the REST client's transport may have added h2 to the config).
	cfg.TlsConfig = c.cfg.TLS.Clone()
	cfg.TlsConfig.NextProtos = []string{"http/1.1"}
	if c.cfg.Token != "" {
		cfg.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	ws, err := cfg.DialContext(ctx)
	if err != nil {
		return fmt.Errorf("opening the %s stream of pod %s/%s: %w", sub, namespace, pod, err)
	}
	defer ws.Close()
	ws.PayloadType = websocket.BinaryFrame
	stop := context.AfterFunc(ctx, func() { ws.Close() })
	defer stop()

	var wmu sync.Mutex
	send := func(b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return websocket.Message.Send(ws, b)
	}
	if o.TTY && o.Size != nil {
		b, _ := json.Marshal(o.Size)
		if err := send(append([]byte{chanResize}, b...)); err != nil {
			return fmt.Errorf("sizing the terminal of pod %s/%s: %w", namespace, pod, err)
		}
	}
	if o.TTY && o.Resize != nil {
		ended := make(chan struct{})
		defer close(ended)
		go func() {
			for {
				select {
				case size := <-o.Resize:
					b, _ := json.Marshal(size)
					if send(append([]byte{chanResize}, b...)) != nil {
						return
					}
				case <-ended:
					return
				}
			}
		}()
	}
	if o.Stdin && stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					if send(append([]byte{chanStdin}, buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					_ = send([]byte{chanClose, chanStdin})
					return
				}
			}
		}()
	}
	var status error
	for {
		var msg []byte
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return status
			}
			return fmt.Errorf("reading the %s stream of pod %s/%s: %w", sub, namespace, pod, err)
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case chanStdout:
			if stdout != nil {
				if _, err := stdout.Write(msg[1:]); err != nil {
					return err
				}
			}
		case chanStderr:
			if stderr != nil {
				if _, err := stderr.Write(msg[1:]); err != nil {
					return err
				}
			}
		case chanError:
			status = streamStatus(msg[1:])
		}
	}
}

// streamStatus reads the Status the API server sends on the error channel
// when the stream's command ends: nil for success, an *ExitError for an
// exit code, else its message.
func streamStatus(b []byte) error {
	var st struct {
		Status  string `json:"status"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
		Details struct {
			Causes []struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"causes"`
		} `json:"details"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("the stream's status: %s", strings.TrimSpace(string(b)))
	}
	if st.Status == "Success" {
		return nil
	}
	for _, c := range st.Details.Causes {
		if c.Reason == "ExitCode" {
			if n, err := strconv.Atoi(c.Message); err == nil {
				return &ExitError{Code: n}
			}
		}
	}
	return errors.New(st.Message)
}
