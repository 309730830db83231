package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"golang.org/x/crypto/ssh"
)

// authTimeout bounds how long a connection may take to finish the handshake
// and authenticate.
const authTimeout = 10 * time.Second

// sshd is the stand-in for a git server over SSH; it runs until killed. It
// accepts public keys listed in the authorized_keys file, for any user name,
// and nothing else; it serves "exec" requests with /bin/sh -c and refuses
// shells and terminals.
func sshd(args []string) {
	fs := flag.NewFlagSet("sshd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	hostKeyFile := fs.String("host-key", "", "the server's private key (OpenSSH PEM)")
	authFile := fs.String("authorized-keys", "", "the public keys allowed in, authorized_keys format")
	port := fs.Int("port", 22, "the TCP port to listen on")
	if err := fs.Parse(args); err != nil {
		fail(fmt.Errorf("sshd: %w", err))
	}
	if *hostKeyFile == "" || *authFile == "" || fs.NArg() > 0 {
		fail(fmt.Errorf("usage: probe sshd --host-key FILE --authorized-keys FILE [--port N]"))
	}

	pem, err := os.ReadFile(*hostKeyFile)
	check(wrap("reading the host key", err))
	hostKey, err := ssh.ParsePrivateKey(pem)
	check(wrap("parsing the host key", err))
	authorized, err := readAuthorizedKeys(*authFile)
	check(err)

	config := &ssh.ServerConfig{
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			fp := ssh.FingerprintSHA256(key)
			for _, k := range authorized {
				if bytes.Equal(k.Marshal(), key.Marshal()) {
					say("auth publickey %s ok %s", meta.User(), fp)
					return &ssh.Permissions{}, nil
				}
			}
			say("auth publickey %s denied %s", meta.User(), fp)
			return nil, fmt.Errorf("key %s is not authorized", fp)
		},
		// No PasswordCallback and no KeyboardInteractiveCallback: those
		// methods are not offered, and a client trying them is refused.
		AuthLogCallback: func(meta ssh.ConnMetadata, method string, err error) {
			if method != "none" && method != "publickey" {
				say("auth %s %s denied", method, meta.User())
			}
		},
	}
	config.AddHostKey(hostKey)

	ln, err := net.Listen("tcp", ":"+strconv.Itoa(*port))
	check(err)
	say("sshd listening")
	for {
		conn, err := ln.Accept()
		check(err)
		go serveSSH(conn, config)
	}
}

// readAuthorizedKeys parses every key in an authorized_keys file.
func readAuthorizedKeys(path string) ([]ssh.PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the authorized keys: %w", err)
	}
	var keys []ssh.PublicKey
	for rest := bytes.TrimSpace(data); len(rest) > 0; {
		key, _, _, next, err := ssh.ParseAuthorizedKey(rest)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		keys = append(keys, key)
		rest = next
	}
	return keys, nil
}

// serveSSH authenticates one connection, closing it unless that is done
// within authTimeout, then serves its session channels.
func serveSSH(conn net.Conn, config *ssh.ServerConfig) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(authTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(conn, config)
	if err != nil {
		return
	}
	defer sc.Close()
	conn.SetDeadline(time.Time{})
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only session channels")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go serveSession(ch, chReqs)
	}
}

// serveSession runs the session's one exec request. It accepts GIT_PROTOCOL
// from "env" requests, as a git host's sshd does, and refuses every other
// request (shell, pty-req, agent forwarding, ...).
func serveSession(ch ssh.Channel, reqs <-chan *ssh.Request) {
	var env []string
	started := false
	for req := range reqs {
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if err := ssh.Unmarshal(req.Payload, &kv); err != nil || kv.Name != "GIT_PROTOCOL" {
				req.Reply(false, nil)
				continue
			}
			env = append(env, kv.Name+"="+kv.Value)
			req.Reply(true, nil)
		case "exec":
			var cmd struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &cmd); err != nil || started {
				req.Reply(false, nil)
				continue
			}
			started = true
			say("exec %s", cmd.Command)
			req.Reply(true, nil)
			go runExec(ch, cmd.Command, env)
		default:
			req.Reply(false, nil)
		}
	}
	if !started {
		ch.Close()
	}
}

// runExec runs command with /bin/sh -c on the channel's streams, then sends
// its exit status and closes the channel.
func runExec(ch ssh.Channel, command string, env []string) {
	defer ch.Close()
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = ch
	cmd.Stderr = ch.Stderr()
	// Stdin is copied here rather than by exec, so that Wait does not wait
	// for a client that never sends EOF.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		fmt.Fprintf(ch.Stderr(), "probe sshd: %v\n", err)
		sendExitStatus(ch, 255)
		return
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(ch.Stderr(), "probe sshd: %v\n", err)
		sendExitStatus(ch, 255)
		return
	}
	go func() {
		io.Copy(stdin, ch)
		stdin.Close()
	}()
	status := 0
	if err := cmd.Wait(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() >= 0 {
			status = exit.ExitCode()
		} else {
			status = 255
		}
	}
	ch.CloseWrite()
	sendExitStatus(ch, status)
}

func sendExitStatus(ch ssh.Channel, status int) {
	ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(status)}))
}
