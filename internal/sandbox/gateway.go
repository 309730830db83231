package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// Environment variables that change where the allowlist gateway comes from
// and goes out through.
const (
	// EnvGatewayBinary names a Linux build of propio-sandbox to make the
	// gateway image from, for a launcher that is not one (macOS).
	EnvGatewayBinary = "PROPIO_SANDBOX_GATEWAY_BINARY"
	// EnvGatewayNetwork names an existing network for the gateway's way out,
	// instead of one made for each sandbox.
	EnvGatewayNetwork = "PROPIO_SANDBOX_GATEWAY_NETWORK"
)

// ErrGatewayBinary: there is no Linux executable to make the gateway image
// of (errors.Is finds it in the errors that say why).
var ErrGatewayBinary = errors.New("no executable for the gateway image")

// gatewayError says why, and is ErrGatewayBinary.
type gatewayError struct{ err error }

func (e gatewayError) Error() string        { return e.err.Error() }
func (e gatewayError) Unwrap() error        { return e.err }
func (e gatewayError) Is(target error) bool { return target == ErrGatewayBinary }

// gatewayBinary is the executable the gateway image is made of: this one,
// unless PROPIO_SANDBOX_GATEWAY_BINARY names another.
func gatewayBinary() (string, error) {
	if exe := os.Getenv(EnvGatewayBinary); exe != "" {
		return exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", gatewayError{fmt.Errorf("finding this executable for the gateway image: %w", err)}
	}
	return exe, nil
}

// GatewayOptions fills in the gateway's image and outside network.
func GatewayOptions(o *generator.Options, dirs hostinfo.Dirs) error {
	o.OutsideNetwork = os.Getenv(EnvGatewayNetwork)
	exe, err := gatewayBinary()
	if err != nil {
		return err
	}
	if o.GatewayImage, err = gatewayimage.CachedTag(exe, filepath.Join(dirs.State, "gateway-image")); err != nil {
		return gatewayError{err}
	}
	return nil
}

// prepareGateway numbers the sandbox network apart from the engine's,
// generates the project, makes sure the gateway's image exists (building it
// from this executable when it does not), starts the decision log, and
// readies the run's brokering (prepareBroker). It returns the project and
// how its variables are filled in. What it made for the run is removed
// when it fails.
func (l *launch) prepareGateway(ctx context.Context, o generator.Options, adjust func(*generator.Host)) (_ *types.Project, _ func(string) (string, bool), err error) {
	used, err := l.rt.UsedSubnets(ctx)
	if err != nil {
		return nil, nil, err
	}
	if o.Subnet, err = generator.PickSubnet(o.Project, used); err != nil {
		return nil, nil, err
	}
	if generator.Opens(l.plan.Profile, l.plan.host) {
		// The image's own trust store, over which the run's is mounted.
		store, _, err := l.trustStore(ctx, l.plan.Profile.Image)
		if err != nil {
			return nil, nil, err
		}
		adjust = withTrustStore(adjust, store)
	}
	project, err := l.plan.Generate(o, adjust)
	if err != nil {
		return nil, nil, err
	}
	if err := l.gatewayImage(ctx, o.GatewayImage); err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			dropRunDirs(o.Project)
		}
	}()
	if err := l.gatewayFiles(o.Project, o.Subnet, true); err != nil {
		return nil, nil, err
	}
	lookup, err := l.prepareBroker(ctx, project, true)
	if err != nil {
		return nil, nil, err
	}
	return project, lookup, nil
}

// gatewayFiles makes what the gateway of project, on subnet, reads and
// writes on the host: the sandbox's resolv.conf, the decision log (started
// when newLog, else appended to: a persistent sandbox started again), and
// the ask directory when the profile asks.
func (l *launch) gatewayFiles(project string, subnet netip.Prefix, newLog bool) error {
	dirs := l.plan.Env.Dirs
	if err := writeResolvConf(dirs.ResolvDir(), generator.GatewayAddr(subnet)); err != nil {
		return err
	}
	if newLog {
		if _, err := decisionlog.Start(dirs.LogDir(), decisionlog.Header{Time: time.Now().UTC(), Project: project, Workspace: l.plan.Env.Workspace, Profile: l.plan.Profile.Meta.File}); err != nil {
			return err
		}
	}
	if l.facts.Remote {
		if err := stageRemoteLog(dirs, project); err != nil {
			return err
		}
	}
	if l.plan.Profile.Network.Asks() {
		base, err := ask.BaseDir()
		if err != nil {
			return err
		}
		if _, err := ask.Make(base, project, l.plan.Env.Workspace); err != nil {
			return err
		}
	}
	return nil
}

// remoteLogs holds the directories where the decision logs of gateways on
// a remote engine are staged, one per project (remoteLogDir): copied into
// the gateway's log volume before the run, and back after it
// (generator.Host.RemoteLogs).
func remoteLogs(dirs hostinfo.Dirs) string { return filepath.Join(dirs.State, "remote-logs") }

// remoteLogDir is where the decision log of project's gateway on a remote
// engine is staged.
func remoteLogDir(dirs hostinfo.Dirs, project string) string {
	return filepath.Join(remoteLogs(dirs), project)
}

// stageRemoteLog puts a copy of project's decision log, as started, alone
// in its remoteLogDir.
func stageRemoteLog(dirs hostinfo.Dirs, project string) error {
	stage := remoteLogDir(dirs, project)
	if err := os.RemoveAll(stage); err != nil {
		return fmt.Errorf("staging the gateway log for the engine: %w", err)
	}
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return fmt.Errorf("staging the gateway log for the engine: %w", err)
	}
	b, err := os.ReadFile(decisionlog.Path(dirs.LogDir(), project))
	if err != nil {
		return fmt.Errorf("staging the gateway log for the engine: %w", err)
	}
	if err := os.WriteFile(decisionlog.Path(stage, project), b, 0o600); err != nil {
		return fmt.Errorf("staging the gateway log for the engine: %w", err)
	}
	return nil
}

// settleRemoteLog puts the decision log that came back from a remote
// engine's gateway in the log directory, in place of the one started
// there, and removes its stage. Without one (the gateway never ran, or its
// copy back failed), the started log stays.
func settleRemoteLog(dirs hostinfo.Dirs, project string) error {
	stage := remoteLogDir(dirs, project)
	defer os.RemoveAll(stage)
	from := decisionlog.Path(stage, project)
	if _, err := os.Stat(from); err != nil {
		return nil
	}
	if err := os.Rename(from, decisionlog.Path(dirs.LogDir(), project)); err != nil {
		return fmt.Errorf("keeping the gateway log that came back from the engine: %w", err)
	}
	return nil
}

// withTrustStore is adjust, and the image's trust store at path.
func withTrustStore(adjust func(*generator.Host), path string) func(*generator.Host) {
	return func(h *generator.Host) {
		if adjust != nil {
			adjust(h)
		}
		h.TrustStore = path
	}
}

// dropRunDirs removes the ask directory of project, once its gateway is
// gone (frontends stop seeing the sandbox), the agent's directory, the
// broker directory (the run's file, if its gateway never took it) and the
// sandbox's trust files.
func dropRunDirs(project string) {
	if base, err := ask.BaseDir(); err == nil {
		_ = os.RemoveAll(generator.AskDir(base, project))
	}
	if base, err := ask.AgentBaseDir(); err == nil {
		_ = os.RemoveAll(generator.AgentDir(base, project))
	}
	if brokers, cas, err := broker.BaseDirs(); err == nil {
		_ = os.RemoveAll(filepath.Join(brokers, project))
		_ = os.RemoveAll(filepath.Join(cas, project))
	}
}

// gatewayImage makes the gateway's image from this executable, unless the
// engine has it.
func (l *launch) gatewayImage(ctx context.Context, image string) error {
	has, err := l.rt.HasImage(ctx, image)
	if err != nil || has {
		return err
	}
	exe, err := gatewayBinary()
	if err != nil {
		return err
	}
	l.report.Note(fmt.Sprintf("making the gateway image %s from %s", image, exe))
	bctx, err := gatewayimage.Context(exe)
	if err != nil {
		return gatewayError{err}
	}
	return l.rt.BuildImage(ctx, image, bctx)
}

// writeResolvConf writes the resolv.conf that points a sandbox at its
// gateway, unless it is there already (each gateway address has its own).
func writeResolvConf(dir string, gw netip.Addr) error {
	path := filepath.Join(dir, generator.ResolvConfName(gw))
	if err := fsutil.WriteFileIfChanged(path, []byte(generator.ResolvConf(gw)), 0o644); err != nil {
		return fmt.Errorf("writing the sandbox's resolv.conf: %w", err)
	}
	return nil
}
