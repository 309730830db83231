package sandbox

// Credential brokering, the launch's part: the secrets' values read on the
// host (once a launch), a sentinel for each, the run's file in the
// gateway's broker directory, and the sandbox's trust files (the image's
// trust store with the CA the gateway made). The values go to the gateway's
// file only: the sandbox's variables are filled in with the sentinels.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Bounds of what is read for a secret or a trust store.
const (
	maxSecretBytes     = 64 << 10
	maxTrustStoreBytes = 4 << 20
	secretCommandLimit = 30 * time.Second
)

// SecretError: a secret's value could not be read. It names the secret,
// where the profile sets it and where its value comes from; never a value.
type SecretError struct {
	Name   string
	Pos    profile.Pos
	Source string
	Err    error
}

func (e *SecretError) Error() string {
	return fmt.Sprintf("%s: secrets.%s: reading its value (%s): %v", e.Pos, e.Name, e.Source, e.Err)
}

func (e *SecretError) Unwrap() error { return e.Err }

// secretValues reads the values of the secrets named, once a launch (the
// declared checks' sandboxes and the run's share them).
func (l *launch) secretValues(ctx context.Context, names []string) (map[string]string, error) {
	if l.values == nil {
		l.values = map[string]string{}
	}
	for _, name := range names {
		if _, ok := l.values[name]; ok {
			continue
		}
		s := l.Profile.Secrets[name]
		from := generator.SecretSource(s, l.plan.host)
		v, err := readSecret(ctx, from, l.Env.Workspace)
		if err != nil {
			return nil, &SecretError{Name: name, Pos: l.Profile.Pos("secrets", name, "from"), Source: from.String(), Err: err}
		}
		l.values[name] = v
	}
	return l.values, nil
}

// readSecret reads one value: a host variable, a file (a trailing newline
// dropped), or a command's standard output (trimmed) run in the workspace.
// An empty value is an error. No error holds the value.
func readSecret(ctx context.Context, from profile.SecretSource, workspace string) (string, error) {
	var v string
	switch {
	case from.Env != "":
		v = os.Getenv(from.Env)
	case from.File != "":
		data, err := fsutil.ReadRegular(from.File, maxSecretBytes)
		if err != nil {
			return "", errors.New(fsutil.Problem(err))
		}
		v = strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	default:
		out, err := runSecretCommand(ctx, from.Command, workspace)
		if err != nil {
			return "", err
		}
		v = strings.TrimSpace(out)
	}
	if v == "" {
		return "", errors.New("it is empty")
	}
	if strings.ContainsAny(v, "\r\n\x00") {
		return "", errors.New("it holds a line break or a NUL, which no header can carry")
	}
	return v, nil
}

// runSecretCommand runs a secret's command and returns its standard
// output. On failure it says how the command ended and the end of its
// standard error, with anything it printed on standard output masked.
func runSecretCommand(ctx context.Context, args []string, workspace string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, secretCommandLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = workspace
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxSecretBytes, 4<<10
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stdout.over {
		return "", fmt.Errorf("its output is larger than %d bytes", maxSecretBytes)
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if out := strings.TrimSpace(stdout.String()); out != "" {
			msg = strings.ReplaceAll(msg, out, "***")
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("it did not finish within %s", secretCommandLimit)
		}
		if msg != "" {
			lines := strings.Split(msg, "\n")
			return "", fmt.Errorf("%v: %s", err, lines[len(lines)-1])
		}
		return "", err
	}
	return stdout.String(), nil
}

// limitedBuffer keeps what is written up to max bytes, and notes more (a
// writer alone: io.Copy must not go round Write through a ReadFrom).
type limitedBuffer struct {
	buf  []byte
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.max - len(b.buf); len(p) > room {
		b.over = true
		p = p[:max(room, 0)]
	}
	b.buf = append(b.buf, p...)
	return n, nil
}

func (b *limitedBuffer) String() string { return string(b.buf) }

// trustStore is the image's trust store, its path and content (none for an
// image without one), read once an image (by its ID, kept in the state
// directory) and once a launch.
func (l *launch) trustStore(ctx context.Context, image string) (string, []byte, error) {
	if l.store != nil {
		return l.store.path, l.store.data, nil
	}
	id, err := l.rt.ImageID(ctx, image)
	if err != nil {
		return "", nil, err
	}
	cache := filepath.Join(l.Env.Dirs.State, "trust", strings.ReplaceAll(id, ":", "-"))
	path, data := "", []byte(nil)
	if b, err := os.ReadFile(cache); err == nil {
		p, rest, _ := bytes.Cut(b, []byte("\n"))
		path, data = string(p), rest
	} else {
		if path, data, err = l.rt.ImageFile(ctx, image, hostinfo.TrustStores(), maxTrustStoreBytes); err != nil {
			return "", nil, err
		}
		// A cache that cannot be written costs the next launch a lookup.
		if os.MkdirAll(filepath.Dir(cache), 0o700) == nil {
			_ = fsutil.WriteFileAtomic(cache, append([]byte(path+"\n"), data...), 0o600)
		}
	}
	l.store = &imageStore{path: path, data: data}
	return path, data, nil
}

type imageStore struct {
	path string
	data []byte
}

// runBroker is what a launch hands its gateway once it runs (handBroker):
// the run's secrets, in the gateway's broker directory.
type runBroker struct {
	dir     string // the gateway's broker directory
	project string
	run     broker.Run
}

// prepareBroker readies a run's brokering, when the project's gateway
// opens connections: it reads the secrets' values, makes their sentinels
// (a persistent sandbox started again has its own still) and the broker
// directory, unless the gateway's keeper made it (fresh false). It
// returns how the sandbox's variables are filled in: a secret's with its
// sentinel, never from the host; the others from the launcher's
// environment. The run's CA is the gateway's own: handBroker takes its
// certificate once the gateway runs.
func (l *launch) prepareBroker(ctx context.Context, project *types.Project, fresh bool) (func(string) (string, bool), error) {
	l.broker = nil
	secret := func(name string) bool { _, ok := l.Profile.Secrets[name]; return ok }
	lookup := func(name string) (string, bool) {
		if secret(name) {
			return "", false
		}
		return os.LookupEnv(name)
	}
	ext, err := generator.ReadExtension(project)
	if err != nil || ext.Gateway == nil || ext.Gateway.Broker == nil {
		return lookup, err
	}
	names := make([]string, 0, len(ext.Gateway.Broker.Secrets))
	for name := range ext.Gateway.Broker.Secrets {
		names = append(names, name)
	}
	slices.Sort(names)
	values, err := l.secretValues(ctx, names)
	if err != nil {
		return nil, err
	}
	if err := l.checkUpstreamCA(); err != nil {
		return nil, err
	}
	sentinels, err := l.Keep.sentinels(names)
	if err != nil {
		return nil, err
	}
	b := &runBroker{dir: filepath.Join(l.plan.host.BrokerDir, project.Name), project: project.Name}
	for _, name := range names {
		b.run.Secrets = append(b.run.Secrets, broker.Secret{Name: name, Sentinel: sentinels[name], Value: values[name]})
	}
	if fresh {
		if b.dir, err = broker.MakeDir(l.plan.host.BrokerDir, project.Name); err != nil {
			return nil, err
		}
	}
	l.broker = b
	return func(name string) (string, bool) {
		if s, ok := sentinels[name]; ok {
			return s, true
		}
		return lookup(name)
	}, nil
}

// handBroker hands the gateway, once it runs and before the sandbox is
// made, the run's brokering: it reads the certificate of the CA the gateway
// made, writes the sandbox's trust files with it, and the run's secrets
// into the broker directory, for the gateway to take.
func (l *launch) handBroker(ctx context.Context) error {
	b := l.broker
	caPEM, err := broker.ReadCA(ctx, b.dir)
	if err != nil {
		return err
	}
	if err := l.writeTrustFiles(ctx, b.project, caPEM); err != nil {
		return err
	}
	return broker.WriteRun(b.dir, b.run)
}

// writeTrustFiles writes the sandbox's trust files for the run's CA into
// its directory (mode 0755, files 0644: certificates, read by whatever
// user the sandbox runs as). A persistent sandbox started again has them
// written again, for its gateway's new CA.
func (l *launch) writeTrustFiles(ctx context.Context, project, caPEM string) error {
	_, store, err := l.trustStore(ctx, l.Profile.Image)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.plan.host.CADir, 0o700); err != nil {
		return fmt.Errorf("writing the sandbox's trust files: %w", err)
	}
	dir := filepath.Join(l.plan.host.CADir, project)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("writing the sandbox's trust files: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("writing the sandbox's trust files: %w", err)
	}
	bundle := broker.Bundle(store, caPEM)
	for name, data := range map[string][]byte{
		broker.CAFile:         []byte(caPEM),
		broker.BundleFile:     bundle,
		broker.TrustStoreFile: broker.JKS(broker.Certificates(bundle), time.Now()),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("writing the sandbox's trust files: %w", err)
		}
	}
	return nil
}

// checkUpstreamCA reads network.upstream_ca, which must hold a certificate.
func (l *launch) checkUpstreamCA() error {
	f := generator.UpstreamCA(l.Profile, l.plan.host)
	if f == "" {
		return nil
	}
	data, err := fsutil.ReadRegular(f, 1<<20)
	if err == nil && len(broker.Certificates(data)) == 0 {
		err = errors.New("no PEM certificate in it")
	}
	if err != nil {
		return fmt.Errorf("%s: network.upstream_ca: %s: %s", l.Profile.Pos("network", "upstream_ca"), f, fsutil.Problem(err))
	}
	return nil
}
