// Package archtest keeps the pipeline's layering: loader -> pure generator ->
// one engine package, with the CLI on top and imported by nothing but main.
package archtest

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/propio/propio-sandbox"

type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func list(t *testing.T) map[string]pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps=false", "-json=ImportPath,Imports,Deps", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

func TestLayering(t *testing.T) {
	pkgs := list(t)
	forbidden := map[string][]string{
		// The generator is pure: no engine, no CLI, no host gathering, no processes or network.
		module + "/generator":        {module + "/internal/cli", module + "/internal/hostinfo", module + "/internal/kubeapi", module + "/internal/kube", "github.com/docker/compose", "github.com/moby/moby/client", "github.com/docker/docker/client"},
		module + "/internal/profile": {module + "/internal/cli", module + "/generator", module + "/internal/hostinfo", "github.com/docker/compose"},
		module + "/schema":           {module + "/"},
		module + "/profiles":         {module + "/"},
		module + "/templates":        {module + "/"},
		// The module root only embeds the default image's build context.
		module:                        {module + "/"},
		module + "/internal/hostinfo": {module + "/internal/cli", "github.com/docker/compose"},
		// diskcap measures host file systems; the engine tells it where. It
		// may use fsutil, the leaf that opens host files safely, and nothing
		// else of ours.
		module + "/internal/diskcap": {module + "/", "github.com/docker/compose", "github.com/moby/moby/client"},
		// The decision log store owns a file format: nothing of ours, so
		// the generator may name its files and the gateway write them.
		module + "/internal/decisionlog": {module + "/"},
		// Brokering's material (the run's CA, its file for the gateway, the
		// sandbox's trust files) is a format too: the generator names its
		// files, the launch writes them, the gateway reads them.
		module + "/internal/broker": {module + "/"},
		// The ask protocol (its types, the host's client, the gateway's
		// broker) is shared by the CLI's frontends and the gateway: it
		// depends on nothing of ours, so both may import it.
		module + "/internal/ask": {module + "/"},
		// The port relay (the relay container's side and the launcher's)
		// moves bytes: nothing of ours, so the relay's subcommand and the
		// launch may both import it.
		module + "/internal/portrelay": {module + "/"},
		// The gateway decides and relays; the kernel forwards behind its
		// Kernel interface (natfwd is gatewayd's), and it never sees a
		// profile, a project or an engine.
		module + "/internal/gateway": {module + "/internal/cli", module + "/internal/engine", module + "/generator", module + "/internal/profile",
			module + "/internal/natfwd", module + "/internal/gatewayd", "github.com/docker/compose", "github.com/compose-spec/compose-go"},
		// The gateway's process runs in the gateway container: the gateway,
		// natfwd and the log, no CLI, engine, generator or profile.
		module + "/internal/gatewayd": {module + "/internal/cli", module + "/internal/engine", module + "/generator", module + "/internal/profile",
			module + "/internal/hostinfo", module + "/internal/grants", "github.com/docker/compose", "github.com/compose-spec/compose-go"},
		// changeset keeps what a sandbox wrote, apart from the originals:
		// files only, no engine, no profile, nothing else of ours.
		module + "/internal/changeset": {module + "/", "github.com/docker/compose", "github.com/moby/moby/client"},
		// A changeset's launch takes the engine through its own small
		// interface; package sandbox calls it (the CLI, until sandbox runs the launch).
		module + "/internal/changeset/launch": {module + "/internal/cli", module + "/internal/sandbox", module + "/internal/engine", "github.com/docker/compose", "github.com/moby/moby/client"},
		// backend is the contract between a launch and an engine: the
		// engine implements it, the launch drives it, and it depends on
		// neither, nor on anything else of ours.
		module + "/internal/backend": {module + "/"},
		// The user's grants are a store of rules: they reach the gateway as
		// its flags, through the plan and the generator. The store knows no
		// launch, engine or gateway, and no gateway reads it.
		module + "/internal/grants": {module + "/internal/cli", module + "/internal/sandbox", module + "/internal/engine",
			module + "/internal/gateway", module + "/internal/gatewayd", "github.com/docker/compose", "github.com/moby/moby/client"},
		// The approval frontends (approve, ui) talk to sandboxes through the
		// ask protocol's client and read decision logs: no CLI, launch,
		// engine, gateway, generator or profile.
		module + "/internal/approver": {module + "/internal/cli", module + "/internal/sandbox", module + "/internal/engine", module + "/internal/gateway",
			module + "/internal/gatewayd", module + "/generator", module + "/internal/profile", "github.com/docker/compose", "github.com/moby/moby/client"},
		// Background processes are started and told apart: nothing of ours.
		module + "/internal/daemon": {module + "/"},
		// The Kubernetes API client knows nothing of ours; the cluster side
		// of a sandbox (internal/kube) takes the generator's objects and
		// talks through it, never through an engine or the CLI.
		module + "/internal/kubeapi": {module + "/"},
		module + "/internal/kube":    {module + "/internal/cli", module + "/internal/sandbox", module + "/internal/engine", "github.com/docker/compose", "github.com/moby/moby/client"},
		// The launch is below the CLI.
		module + "/internal/sandbox": {module + "/internal/cli"},
		// termsafe makes text inert for a terminal: nothing of ours, so the
		// ask protocol may refuse what it would escape and every frontend
		// show the rest.
		module + "/internal/termsafe": {module + "/"},
	}
	// Leaves any package may use whatever its rule says about the module.
	leaves := map[string]bool{module + "/internal/fsutil": true, module + "/internal/termsafe": true}
	for path, bad := range forbidden {
		p, ok := pkgs[path]
		if !ok {
			t.Errorf("package %s is missing", path)
			continue
		}
		for _, dep := range p.Deps {
			if leaves[dep] {
				continue
			}
			for _, b := range bad {
				if dep == b || strings.HasPrefix(dep, b+"/") || (strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b)) {
					t.Errorf("%s must not depend on %s (it does, through %s)", path, b, dep)
				}
			}
		}
	}
	// The generator performs no I/O and runs nothing: it imports neither os
	// nor anything that execs or dials. (Its dependencies may: compose-go's
	// types link os/exec, which the generator never calls.)
	for _, imp := range pkgs[module+"/generator"].Imports {
		switch imp {
		case "os", "os/exec", "net", "net/http", "syscall", module + "/internal/fsutil":
			t.Errorf("the generator imports %s; it must stay pure", imp)
		}
	}
	// The CLI presents; the gateway's process and the kernel forwarding it
	// sets up are internal/gatewayd's.
	for _, imp := range pkgs[module+"/internal/cli"].Imports {
		switch imp {
		case module + "/internal/gateway", module + "/internal/natfwd":
			t.Errorf("internal/cli imports %s; the gateway's process is internal/gatewayd's", imp)
		}
	}
	for _, imp := range pkgs[module+"/internal/profile"].Imports {
		if imp == "os/exec" || imp == "net" || imp == "net/http" {
			t.Errorf("internal/profile imports %s", imp)
		}
	}
	// The CLI presents the domain packages; what they use is theirs: a
	// launch, its engine, gateway and changeset are internal/sandbox's.
	for _, imp := range pkgs[module+"/internal/cli"].Imports {
		switch imp {
		case module + "/internal/changeset", module + "/internal/changeset/launch", module + "/internal/engine",
			module + "/internal/gatewayimage", module + "/internal/backend", module + "/internal/guard":
			t.Errorf("internal/cli imports %s; it presents internal/sandbox", imp)
		}
	}
	// One engine package: only internal/engine talks to a container engine.
	// Test support stays out of the product.
	for path, p := range pkgs {
		for _, imp := range p.Imports {
			engineAPI := strings.HasPrefix(imp, "github.com/docker/compose/") || strings.HasPrefix(imp, "github.com/moby/moby/client") ||
				strings.HasPrefix(imp, "github.com/docker/cli/")
			if engineAPI && path != module+"/internal/engine" {
				t.Errorf("%s imports %s; only internal/engine may talk to the engine", path, imp)
			}
		}
		for _, dep := range p.Deps {
			if dep == module+"/internal/testenv" {
				t.Errorf("%s depends on internal/testenv, which is for tests only", path)
			}
		}
	}
	for path, p := range pkgs {
		if path == module+"/cmd/propio-sandbox" || path == module+"/internal/cli" {
			continue
		}
		for _, dep := range p.Deps {
			if dep == module+"/internal/cli" {
				t.Errorf("%s imports the CLI; only cmd/propio-sandbox may", path)
			}
		}
	}
}

// TestEngineBehindTheRuntime: a launch drives its engine through
// backend.Runtime. Within internal/sandbox only connect.go, where a launch
// connects (and another backend would plug in), knows internal/engine;
// no other package imports it (the built-in checks read the engine's info
// through the runtime too).
func TestEngineBehindTheRuntime(t *testing.T) {
	const eng = module + "/internal/engine"
	mayImport := map[string]bool{eng: true, module + "/internal/sandbox": true}
	for path, p := range list(t) {
		if !mayImport[path] && slices.Contains(p.Imports, eng) {
			t.Errorf("%s imports internal/engine; a launch drives the engine through backend.Runtime (internal/sandbox connects it)", path)
		}
	}
	files, err := filepath.Glob("../sandbox/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no files of internal/sandbox: %v", err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || filepath.Base(f) == "connect.go" {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if strings.Trim(imp.Path.Value, `"`) == eng {
				t.Errorf("%s imports internal/engine; the launch works over backend.Runtime, and only connect.go makes the engine", f)
			}
		}
	}
}

// TestCLIFunctionsShort: internal/cli holds flags, output and hints, in
// functions of at most 60 lines (function literals included).
func TestCLIFunctionsShort(t *testing.T) {
	files, err := filepath.Glob("../cli/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no files of internal/cli: %v", err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch x := n.(type) {
			case *ast.FuncDecl:
				body = x.Body
			case *ast.FuncLit:
				body = x.Body
			}
			if body == nil {
				return true
			}
			start, end := fset.Position(n.Pos()), fset.Position(body.End())
			if lines := end.Line - start.Line + 1; lines > 60 {
				t.Errorf("%s:%d: a function of %d lines; internal/cli keeps them to 60 (move the work to a domain package)", f, start.Line, lines)
			}
			return true
		})
	}
}
