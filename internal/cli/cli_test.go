package cli_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/propio/propio-sandbox/internal/cli"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"github.com/propio/propio-sandbox/schema"
	"github.com/rogpeppe/go-internal/testscript"
)

// -update rewrites the expected files of failing cmp commands in
// testdata/script. gotest.tools, linked in through the Compose SDK, defines
// a global -update flag already; the scripts share it when it is there.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the expected files of failing cmp commands in testdata/script")
	}
}

func updating() bool { return flag.Lookup("update").Value.String() == "true" }

// TestMain makes the test binary double as propio-sandbox: a script's
// `exec propio-sandbox ...` runs cli.Main in a child process, so exit codes,
// stdout and stderr are the real ones.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"propio-sandbox": func() {
			os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
		},
	})
}

// TestScripts runs the CLI behaviour scripts in testdata/script. Each one
// starts in an empty $WORK with its own HOME and XDG directories, so that
// nothing of the real home, config or trust store is read or written.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 filepath.Join("testdata", "script"),
		Setup:               setup,
		Condition:           condition,
		Cmds:                map[string]func(*testscript.TestScript, bool, []string){"exitcode": cmdExitcode, "validjson": cmdValidJSON, "doctorschema": cmdDoctorSchema, "mkchangeset": cmdMkChangeset, "mkfifo": cmdMkfifo},
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		UpdateScripts:       updating(),
	})
}

// keep are the variables testscript itself sets that the scripts may see.
// testscript starts from a fresh environment; setup drops anything else all
// the same, so that no variable of the environment running the tests
// (XDG_*, PROPIO_*, API keys, TERM) can ever reach propio-sandbox.
var keep = map[string]bool{
	"WORK": true, "PATH": true, "GOTRACEBACK": true, "TMPDIR": true, "TMP": true, "TEMP": true,
	"devnull": true, "/": true, ":": true, "$": true, "exe": true,
	"GOCOVERDIR": true, "GORACE": true, "SYSTEMROOT": true,
}

func setup(env *testscript.Env) error {
	vars := env.Vars[:0:0]
	for _, kv := range env.Vars {
		if name, _, _ := strings.Cut(kv, "="); keep[name] {
			vars = append(vars, kv)
		}
	}
	env.Vars = vars

	work := env.WorkDir
	env.Setenv("HOME", filepath.Join(work, "home"))
	env.Setenv("XDG_CONFIG_HOME", filepath.Join(work, "config"))
	env.Setenv("XDG_STATE_HOME", filepath.Join(work, "state"))
	env.Setenv("PROPIO_HOME", filepath.Join(work, "propio-home"))
	for _, d := range []string{"home", "config", "state", "propio-home"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			return err
		}
	}
	// The workspace propio-sandbox reports is the symlink-free working
	// directory; $WORK may sit below a symbolic link (macOS's /tmp).
	real, err := filepath.EvalSymlinks(work)
	if err != nil {
		return err
	}
	env.Setenv("REALWORK", real)
	// render shows the invoking user's ids (user: host).
	env.Setenv("HOSTUID", strconv.Itoa(os.Getuid()))
	env.Setenv("HOSTGID", strconv.Itoa(os.Getgid()))
	return nil
}

// condition answers the scripts' own conditions:
//
//	[hostfits]  the host has the 2 cores and 2g of memory that the built-in
//	            profiles ask for, so their exact render output is known
//	[onecore]   `taskset -c 0 CMD` can run CMD on one core
func condition(cond string) (bool, error) {
	switch cond {
	case "hostfits":
		l := hostinfo.Limits()
		return l.CPUs >= 2 && (l.Memory == 0 || l.Memory >= 2<<30), nil
	case "onecore":
		return exec.Command("taskset", "-c", "0", "true").Run() == nil, nil
	}
	return false, errors.New("unknown condition " + strconv.Quote(cond))
}

// cmdExitcode runs a program like exec and checks its exit code:
//
//	exitcode N program [args...]
//
// `! exec` accepts any failure; usage errors (2) and other failures (1) are
// different promises, so the scripts check which one they got.
func cmdExitcode(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! exitcode")
	}
	if len(args) < 2 {
		ts.Fatalf("usage: exitcode N program [args...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil || want < 0 {
		ts.Fatalf("exitcode: %q is not an exit code", args[0])
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exitcode: running %s: %v", args[1], err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited with code %d, want %d", args[1], got, want)
	}
}

// cmdValidJSON checks that a file (or stdout) is one JSON object, and that
// it has the given top-level keys:
//
//	validjson FILE [KEY...]
func cmdValidJSON(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 1 {
		ts.Fatalf("usage: validjson FILE [KEY...]")
	}
	var obj map[string]json.RawMessage
	err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &obj)
	if err == nil {
		for _, k := range args[1:] {
			if _, ok := obj[k]; !ok {
				err = errors.New("no top-level key " + strconv.Quote(k))
				break
			}
		}
	}
	switch {
	case neg && err == nil:
		ts.Fatalf("%s is a JSON object with keys %q", args[0], args[1:])
	case !neg && err != nil:
		ts.Fatalf("%s: %v", args[0], err)
	}
}

// cmdDoctorSchema checks a file against the JSON Schema of doctor --json:
//
//	doctorschema FILE
func cmdDoctorSchema(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: doctorschema FILE")
	}
	var doc any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &doc); err != nil {
		ts.Fatalf("%s: %v", args[0], err)
	}
	v, err := schema.ValidateDoctor(doc)
	if err != nil {
		ts.Fatalf("%s: %v", args[0], err)
	}
	for _, x := range v {
		ts.Logf("%s: %s: %s", args[0], strings.Join(x.Path, "."), x.Message)
	}
	if len(v) > 0 {
		ts.Fatalf("%s does not match the doctor schema", args[0])
	}
}

// cmdMkfifo makes a named pipe, as an agent in a sandbox could:
//
//	mkfifo PATH
func cmdMkfifo(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: mkfifo PATH")
	}
	ts.Check(syscall.Mkfifo(ts.MkAbs(args[0]), 0o644))
}
