package profile_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/profiles"
)

// writeFiles writes each file (a path relative to dir) with its content.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// validate resolves the file at path and checks it, as `propio-sandbox
// validate FILE` does, and returns the problems found as strings: an error in
// that file as LINE:COL: field: message, an error in another file with its
// name in front. dir is written $DIR.
func validate(t *testing.T, locs profile.Locations, path string, dir string) []string {
	t.Helper()
	_, err := locs.LoadFile(path)
	if err == nil {
		return nil
	}
	var list profile.List
	if !errors.As(err, &list) {
		t.Fatalf("got %T %v, want a profile.List", err, err)
	}
	var got []string
	for _, e := range list {
		s := e.Error()
		if e.Pos.File == path {
			s = strings.TrimPrefix(s, path+":")
		}
		got = append(got, strings.ReplaceAll(s, dir, "$DIR"))
	}
	return got
}

func TestInvalidProfiles(t *testing.T) {
	builtins := strings.Join(profiles.Names(), ", ")
	tests := map[string]struct {
		yaml  string            // p.yaml, the file validated
		files map[string]string // other files, relative to the directory of p.yaml; cfg/ is the ConfigDir
		want  []string
	}{
		// YAML that is not one plain mapping.
		"yaml syntax error": {
			yaml: "image: [unclosed\n",
			want: []string{"2:1: invalid YAML: did not find expected ',' or ']'"}, // where the file ends
		},
		"yaml syntax error in a flow mapping": {
			yaml: "image: a\nnetwork: {mode: none}\nbuild: {context: ${WORKSPACE}}\n",
			want: []string{"3:1: invalid YAML: did not find expected ',' or '}'"},
		},
		"yaml syntax error in a block": {
			yaml: "image: a\nnetwork:\n  mode: none\n - x\n",
			want: []string{"4:1: invalid YAML: did not find expected key"},
		},
		"tab indentation": {
			yaml: "image: a\n\tnetwork: x\n",
			want: []string{"2:1: invalid YAML: found a tab character that violates indentation"},
		},
		"two documents": {
			yaml: "image: a\n---\nimage: b\n",
			want: []string{"2:1: a profile file holds one YAML document; remove the extra ---"},
		},
		"anchor and alias": {
			yaml: "image: &img alpine\ndescription: *img\n",
			want: []string{
				"1:8: YAML anchors and aliases are not supported in profiles; use extends to share settings",
				"2:14: YAML anchors and aliases are not supported in profiles; use extends to share settings",
			},
		},
		"merge key": {
			yaml: "image: a\nnetwork:\n  <<: {mode: open}\n",
			want: []string{"3:3: YAML merge keys (<<) are not supported in profiles; use extends to share settings"},
		},
		"duplicate key": {
			yaml: "image: a\nimage: b\n",
			want: []string{"2:1: image: duplicate key, first set at line 1"},
		},
		"duplicate nested key": {
			yaml: "image: a\nnetwork:\n  mode: none\n  mode: open\n",
			want: []string{"4:3: network.mode: duplicate key, first set at line 3"},
		},
		"custom tag": {
			yaml: "image: !custom x\n",
			want: []string{"1:8: YAML tag !custom is not supported in profiles"},
		},
		"non-scalar key": {
			yaml: "? [a]\n: b\n",
			want: []string{"1:3: mapping keys must be plain names"},
		},
		"not a mapping": {
			yaml: "- image: a\n",
			want: []string{"1:1: got array, want object"},
		},

		// Schema: unknown keys, types, enums, patterns.
		"unknown top-level key": {
			yaml: "image: a\nnetwrok:\n  mode: open\n",
			want: []string{"2:1: netwrok: unknown field"},
		},
		"unknown nested key": {
			yaml: "image: a\nresources:\n  cpu: 2\n",
			want: []string{"3:3: resources.cpu: unknown field"},
		},
		"string for pids": {
			yaml: "image: a\nresources:\n  pids: many\n",
			want: []string{"3:9: resources.pids: got string, want integer"},
		},
		"string for cpus": {
			yaml: "image: a\nresources: {cpus: two}\n",
			want: []string{"2:19: resources.cpus: got string, want number"},
		},
		"list for env.set": {
			yaml: "image: a\nenv:\n  set: [A]\n",
			want: []string{"3:8: env.set: got array, want object"},
		},
		"number for user": {
			yaml: "image: a\nuser: 1000\n",
			want: []string{"2:7: user: got number, want string"},
		},
		"network mode bridged": {
			yaml: "image: a\nnetwork:\n  mode: bridged\n",
			want: []string{"3:9: network.mode: \"bridged\" is not one of: none, open, allowlist"},
		},
		"allow rule too broad": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  allow: [api.example.test, \"*.com\", \"*\"]\n",
			want: []string{
				`4:29: network.allow[1]: "*.com" is too broad: a wildcard must keep at least two labels, as in *.example.com`,
				`4:38: network.allow[2]: "*" is too broad: a rule must name what it allows`,
			},
		},
		"allow rule with a scheme, deny rule with a bad port": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  allow:\n    - https://api.example.test\n  deny: [\"x.test:99999\"]\n",
			want: []string{
				`5:7: network.allow[0]: "https://api.example.test" is not valid here (want a host: a name, *.name or an address, with :port if needed (no scheme or path))`,
				`6:10: network.deny[0]: "x.test:99999": port "99999" is not a number from 1 to 65535`,
			},
		},
		"metadata address rule": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  allow: [169.254.169.254]\n",
			want: []string{`4:11: network.allow[0]: "169.254.169.254" can never be allowed: link-local and cloud metadata addresses are always denied`},
		},
		"inner wildcard": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  allow: [api.*.test]\n",
			want: []string{`4:11: network.allow[0]: "api.*.test": a wildcard may only start a rule, as in *.example.com`},
		},
		"allow without allowlist": {
			yaml: "image: a\nnetwork:\n  mode: open\n  allow: [a.test]\n  bandwidth: 1mbit\n",
			want: []string{
				"4:10: network.allow: applies only to network.mode allowlist, and the mode is open",
				"5:14: network.bandwidth: applies only to network.mode allowlist, and the mode is open",
			},
		},
		"join without allowlist": {
			yaml: "image: a\nnetwork:\n  mode: open\n  join: [ollama-net]\n",
			want: []string{"4:9: network.join: applies only to network.mode allowlist, and the mode is open"},
		},
		"join host": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  join: [models, host]\n",
			want: []string{`4:18: network.join[1]: "host" is not a network a container can join beside others`},
		},
		"join a bad name": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  join: [-x]\n",
			want: []string{`4:10: network.join[0]: "-x" is not valid here (does not match the expected form)`},
		},
		"ask outside allowlist": {
			yaml: "image: a\nnetwork:\n  mode: open\n  unlisted: ask\n  ask_timeout: 30s\n",
			want: []string{
				"4:13: network.unlisted: applies only to network.mode allowlist, and the mode is open",
				"5:16: network.ask_timeout: applies only to network.mode allowlist, and the mode is open",
			},
		},
		"unlisted neither deny nor ask": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  unlisted: prompt\n",
			want: []string{`4:13: network.unlisted: "prompt" is not one of: deny, ask`},
		},
		"idle neither a duration nor off": {
			yaml: "image: a\nresources:\n  idle: never\n",
			want: []string{`3:9: resources.idle: "never" is not valid here (does not match the expected form)`},
		},
		"ask_timeout out of bounds": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  unlisted: ask\n  ask_timeout: 20m\n",
			want: []string{`5:16: network.ask_timeout: 20m is outside 1s .. 10m`},
		},
		"ask_timeout without ask": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  ask_timeout: 30s\n",
			want: []string{`4:16: network.ask_timeout: applies only with network.unlisted: ask`},
		},
		"bandwidth not a rate": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\n  bandwidth: 10mb\n",
			want: []string{`4:14: network.bandwidth: "10mb" is not valid here (want a rate such as 10mbit (bit, kbit, mbit or gbit per second))`},
		},
		"declared check named like a built-in, twice, bad timeout": {
			yaml: "image: a\nchecks:\n  - {name: engine, run: [id]}\n  - {name: key works, run: [id]}\n  - {name: key works, run: [id], timeout: soon}\n",
			want: []string{
				`3:12: checks[0].name: "engine" is the name of a built-in check`,
				`5:12: checks[2].name: "key works" is the name of another check too`,
				`5:43: checks[2].timeout: "soon" is not valid here (want a duration such as 90s, 30m or 2h)`,
			},
		},
		"declared check without a command": {
			yaml: "image: a\nchecks:\n  - {name: key works}\n",
			want: []string{`3:5: checks[0]: missing required field "run"`},
		},
		"ports with allowlist": {
			yaml: "image: a\nnetwork:\n  mode: allowlist\nports: [\"3000\"]\n",
			want: []string{"4:8: ports: cannot be published when network.mode is allowlist: the engine publishes no port of a container on an internal network"},
		},
		"workspace mode": {
			yaml: "image: a\nworkspace:\n  mode: whatever\n",
			want: []string{"3:9: workspace.mode: \"whatever\" is not one of: rw, ro, changeset"},
		},
		"mount inside a changeset workspace": {
			yaml: "image: a\nworkspace:\n  mode: changeset\n  readonly: [.env]\nmounts:\n  - {source: /a, target: /workspace/vendor, mode: changeset}\n  - {source: /b, target: /b, mode: changeset}\n  - {source: /c, target: /workspace-c}\n",
			want: []string{"6:26: mounts[0].target: /workspace/vendor is inside the workspace (/workspace), whose mode is changeset: its mount point would become part of the changeset"},
		},
		"mount mode": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /a, mode: wr}\n",
			want: []string{"3:36: mounts[0].mode: \"wr\" is not one of: ro, rw, changeset"},
		},
		"version 2": {
			yaml: "version: 2\nimage: a\n",
			want: []string{"1:10: version: must be 1"},
		},
		"user name": {
			yaml: "image: a\nuser: bob\n",
			want: []string{`2:7: user: "bob" is not valid here (want host, root or "UID:GID")`},
		},
		"image with a space": {
			yaml: "image: my image\n",
			want: []string{`1:8: image: "my image" is not valid here (want an image reference without spaces)`},
		},
		"relative workspace target": {
			yaml: "image: a\nworkspace:\n  target: work\n",
			want: []string{`3:11: workspace.target: "work" is not valid here (want an absolute path)`},
		},
		"port string": {
			yaml: "image: a\nnetwork: {mode: open}\nports: [abc]\n",
			want: []string{`3:9: ports[0]: "abc" is not valid here (want "PORT", "HOST:PORT" or "IP:HOST:PORT", optionally with /tcp or /udp)`},
		},
		"env.set name": {
			// Next to other keys on purpose: with propertyNames, jsonschema
			// v6.0.3 reported this key under a wrong path, depending on map
			// order (santhosh-tekuri/jsonschema#269); the schema now checks the
			// names with patternProperties.
			yaml: "image: a\nnetwork: {mode: open}\nenv:\n  set:\n    1BAD: x\n    GOOD: y\n",
			want: []string{`5:5: env.set.1BAD: not a valid variable name (letters, digits and _, not starting with a digit)`},
		},
		"env.pass pattern": {
			yaml: "image: a\nenv:\n  pass: [A-B]\n",
			want: []string{`3:10: env.pass[0]: "A-B" is not valid here (want a variable name or a glob such as AWS_*)`},
		},
		"env.required name": {
			yaml: "image: a\nenv:\n  pass: [A_B]\n  required: [A-B]\n",
			want: []string{`4:14: env.required[0]: "A-B" is not valid here (want a variable name: letters, digits and _)`},
		},
		"memory not a size": {
			yaml: "image: a\nresources: {memory: lots}\n",
			want: []string{`2:21: resources.memory: "lots" is not valid here (want a size such as 512m or 2g)`},
		},
		"timeout not a duration": {
			yaml: "image: a\nresources: {timeout: soon}\n",
			want: []string{`2:22: resources.timeout: "soon" is not valid here (want a duration such as 90s, 30m or 2h)`},
		},
		"capability in lower case": {
			yaml: "image: a\nsecurity: {cap_add: [all]}\n",
			want: []string{`2:22: security.cap_add[0]: "all" is not valid here (want a capability name such as NET_BIND_SERVICE or ALL)`},
		},
		"mount without target": {
			yaml: "image: a\nmounts: [{source: /a}]\n",
			want: []string{`2:10: mounts[0]: missing required field "target"`},
		},
		"schema and check errors in one run": {
			// One run reports every problem: a schema error does not hide
			// the checks that need the merged profile.
			yaml: "netwrok: {mode: open}\nresources: {cpus: 0.1}\nenv:\n  pass: ['*']\n  required: [TOKEN]\n",
			want: []string{
				"1:1: netwrok: unknown field",
				"1:1: image is required",
				"2:19: resources.cpus: 0.1 is below the minimum of 0.5",
				`4:10: env.pass[0]: unsafe grant env-glob not named in unsafe: "*" is not anchored on a name prefix: it passes host variables no one named, secrets among them`,
			},
		},
		"empty extends": {
			yaml: "extends: ''\n",
			want: []string{"1:1: image is required", "1:10: extends: must not be empty"},
		},

		// Semantic checks.
		"missing image": {
			yaml: "description: no image\n",
			want: []string{"1:1: image is required"},
		},
		"empty file": {
			yaml: "",
			want: []string{"1:1: image is required"},
		},
		"empty build": {
			yaml:  "extends: ./parent.yaml\nbuild: {}\n",
			files: map[string]string{"parent.yaml": "image: a\nbuild: {context: .}\n"},
			want:  []string{"2:8: build: an empty build changes nothing (maps merge under extends)"},
		},
		"build without context": {
			yaml: "image: a\nbuild: {dockerfile: Dockerfile}\n",
			want: []string{"2:8: build: context is required when build is set"},
		},
		"pass everything": {
			yaml: "image: a\nenv:\n  pass: ['*']\n",
			want: []string{`3:10: env.pass[0]: unsafe grant env-glob not named in unsafe: "*" is not anchored on a name prefix: it passes host variables no one named, secrets among them`},
		},
		"required but not passed": {
			yaml: "image: a\nenv:\n  pass: [AWS_*]\n  required: [AWS_REGION, TOKEN]\n",
			want: []string{"4:26: env.required[1]: TOKEN is required but not passed, so the sandbox would never see it"},
		},
		"agent_requests of no kind": {
			yaml: "image: a\nagent_requests: [resources, ports]\n",
			want: []string{`2:29: agent_requests[1]: "ports" is not one of: port, resources, mount`},
		},
		"agent_requests twice": {
			yaml: "image: a\nagent_requests: [resources, resources]\n",
			want: []string{`2:29: agent_requests[1]: "resources" is named twice`},
		},
		"cpus below minimum": {
			yaml: "image: a\nresources: {cpus: 0.25}\n",
			want: []string{"2:19: resources.cpus: 0.25 is below the minimum of 0.5"},
		},
		"cpus zero": {
			yaml: "image: a\nresources: {cpus: 0}\n",
			want: []string{"2:19: resources.cpus: 0 is below the minimum of 0.5"},
		},
		// How much this host has is preflight's to judge: a profile
		// loads the same everywhere.
		"cpus above any host": {
			yaml: "image: a\nresources: {cpus: 512}\n",
		},
		"memory below minimum": {
			yaml: "image: a\nresources: {memory: 256m}\n",
			want: []string{"2:21: resources.memory: 256m is below the minimum of 512m"},
		},
		"memory above any host": {
			yaml: "image: a\nresources: {memory: 4096g}\n",
		},
		"pids below minimum": {
			yaml: "image: a\nresources: {pids: 5}\n",
			want: []string{"2:19: resources.pids: 5 is outside 10 .. 1000"},
		},
		"pids zero": {
			yaml: "image: a\nresources: {pids: 0}\n",
			want: []string{"2:19: resources.pids: 0 is outside 10 .. 1000"},
		},
		"pids above maximum": {
			yaml: "image: a\nresources: {pids: 5000}\n",
			want: []string{"2:19: resources.pids: 5000 is outside 10 .. 1000"},
		},
		"tmp below minimum": {
			yaml: "image: a\nresources: {tmp: 512m}\n",
			want: []string{"2:18: resources.tmp: 512m is below the minimum of 1g"},
		},
		"tmp above maximum": {
			yaml: "image: a\nresources: {tmp: 200g}\n",
			want: []string{"2:18: resources.tmp: 200g is more than the maximum of 100g"},
		},
		"disk below minimum": {
			yaml: "image: a\nresources: {disk: 512m}\n",
			want: []string{"2:19: resources.disk: 512m is below the minimum of 1g"},
		},
		"disk zero": {
			yaml: "image: a\nresources: {disk: \"0\"}\n",
			want: []string{"2:19: resources.disk: 0 is below the minimum of 1g"},
		},
		"disk above maximum": {
			yaml: "image: a\nresources: {disk: 101g}\n",
			want: []string{"2:19: resources.disk: 101g is more than the maximum of 100g"},
		},
		"disk too large to be a number": {
			yaml: "image: a\nresources: {disk: 99999999999999999999g}\n",
			want: []string{`2:19: resources.disk: "99999999999999999999g" is not a size`},
		},
		"disk not a size": {
			yaml: "image: a\nresources: {disk: ten}\n",
			want: []string{`2:19: resources.disk: "ten" is not valid here (does not match the expected form)`},
		},
		"zero timeout": {
			yaml: "image: a\nresources: {timeout: 0s}\n",
			want: []string{`2:22: resources.timeout: "0s" is not a positive duration`},
		},
		"cap_add ALL": {
			yaml: "image: a\nsecurity:\n  cap_add: [NET_BIND_SERVICE, ALL, CAP_ALL]\n",
			want: []string{
				"3:31: security.cap_add[1]: adding every capability undoes the sandbox",
				"3:36: security.cap_add[2]: adding every capability undoes the sandbox",
			},
		},
		"unknown variable in mount source": {
			yaml: "image: a\nmounts:\n  - {source: '${FOO}/data', target: /data}\n",
			want: []string{`3:14: mounts[0].source: "${FOO}" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`},
		},
		"unknown variable in mount target": {
			yaml: "image: a\nmounts:\n  - {source: /data, target: '/${FOO}'}\n",
			want: []string{`3:29: mounts[0].target: "${FOO}" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`},
		},
		"unknown variables in command": {
			yaml: "image: a\ncommand: [sh, -c, 'echo ${FOO} $BAR $ $$ ${HOME}']\n",
			want: []string{
				`2:19: command[2]: "${FOO}" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`,
				`2:19: command[2]: "$BAR" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`,
				`2:19: command[2]: "$" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`,
			},
		},
		"lone dollar in env.set": {
			yaml: "image: a\nenv:\n  set:\n    PRICE: $5\n",
			want: []string{`4:12: env.set.PRICE: "$" cannot be expanded: only ${WORKSPACE}, ${HOME}, ${PROPIO_HOME} and ~/ are`},
		},
		"duplicate mount targets": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /data}\n  - {source: /b, target: /data}\n",
			want: []string{"4:26: mounts[1].target: /data is already the target of mounts[0]"},
		},
		"mount over the workspace": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /workspace}\n",
			want: []string{"3:26: mounts[0].target: /workspace is already the target of the workspace target"},
		},
		"unclean mount target": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /a/../b}\n",
			want: []string{`3:26: mounts[0].target: "/a/../b" is not a clean absolute path (use "/b")`},
		},
		"mount target /tmp": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /tmp}\n",
			want: []string{"3:26: mounts[0].target: /tmp is the sandbox's tmpfs mount point and cannot be used"},
		},
		"mount target HOME": {
			yaml: "image: a\nmounts:\n  - {source: /a, target: /home/sandbox}\n",
			want: []string{"3:26: mounts[0].target: /home/sandbox is the sandbox's HOME mount point and cannot be used"},
		},
		"workspace target /proc": {
			yaml: "image: a\nworkspace: {target: /proc}\n",
			want: []string{"2:21: workspace.target: /proc is the kernel's mount point and cannot be used"},
		},
		"dot dot in hide": {
			yaml: "image: a\nworkspace:\n  hide: [../secrets, a/../b]\n",
			want: []string{
				`3:10: workspace.hide[0]: "../secrets" must stay inside the workspace (no . or .. segments)`,
				`3:22: workspace.hide[1]: "a/../b" must stay inside the workspace (no . or .. segments)`,
			},
		},
		"dot in readonly": {
			yaml: "image: a\nworkspace:\n  readonly: [./x]\n",
			want: []string{`3:14: workspace.readonly[0]: "./x" must stay inside the workspace (no . or .. segments)`},
		},
		"invalid glob in readonly": {
			yaml: "image: a\nworkspace:\n  readonly: ['[']\n",
			want: []string{`3:14: workspace.readonly[0]: "[" is not a valid pattern: syntax error in pattern`},
		},
		"port out of range": {
			yaml: "image: a\nnetwork: {mode: open}\nports: ['65536']\n",
			want: []string{`3:9: ports[0]: "65536": invalid containerPort: 65536`},
		},
		"ports with network none": {
			yaml: "image: a\nnetwork: {mode: none}\nports: ['3000']\n",
			want: []string{"3:8: ports: cannot be published when network.mode is none: the sandbox has only loopback"},
		},
		"ports with the default network": {
			yaml: "image: a\nports: ['3000']\n",
			want: []string{"2:8: ports: cannot be published when network.mode is none: the sandbox has only loopback"},
		},
		"ports on a built-in without network": {
			yaml: "extends: offline\nports: ['3000']\n",
			want: []string{"2:8: ports: cannot be published when network.mode is none: the sandbox has only loopback"},
		},

		// extends.
		"extends a missing profile": {
			yaml: "extends: nosuch\n",
			want: []string{`1:10: extends: profile "nosuch": profile not found (looked in $DIR/cfg/nosuch.yaml, built-ins: ` + builtins + ")"},
		},
		"extends a missing file": {
			yaml: "extends: ./base.yaml\n",
			want: []string{`1:10: extends: "./base.yaml" does not exist (looked for $DIR/base.yaml)`},
		},
		"extends itself": {
			yaml: "image: a\nextends: ./p.yaml\n",
			want: []string{"2:10: extends: extends cycle: $DIR/p.yaml -> $DIR/p.yaml"},
		},
		"extends cycle through files": {
			yaml:  "extends: ./b.yaml\n",
			files: map[string]string{"b.yaml": "image: a\nextends: ./p.yaml\n"},
			want:  []string{"$DIR/b.yaml:2:10: extends: extends cycle: $DIR/p.yaml -> $DIR/b.yaml -> $DIR/p.yaml"},
		},
		"extends cycle through user profiles": {
			yaml: "extends: a\n",
			files: map[string]string{
				"cfg/a.yaml": "extends: b\n",
				"cfg/b.yaml": "extends: a\n",
			},
			want: []string{"$DIR/cfg/b.yaml:1:10: extends: extends cycle: $DIR/p.yaml -> $DIR/cfg/a.yaml -> $DIR/cfg/b.yaml -> $DIR/cfg/a.yaml"},
		},
		"schema error in the parent": {
			yaml:  "extends: ./parent.yaml\nimage: a\n",
			files: map[string]string{"parent.yaml": "description: parent\nnetwork:\n  mode: bridged\n"},
			want:  []string{"$DIR/parent.yaml:3:9: network.mode: \"bridged\" is not one of: none, open, allowlist"},
		},
		"check error in the parent": {
			yaml:  "extends: ./parent.yaml\ndescription: child\n",
			files: map[string]string{"parent.yaml": "image: a\nresources:\n  pids: 5000\n"},
			want:  []string{"$DIR/parent.yaml:3:9: resources.pids: 5000 is outside 10 .. 1000"},
		},
		"check error in a grandparent": {
			yaml: "extends: ./mid/parent.yaml\n",
			files: map[string]string{
				"mid/parent.yaml": "extends: ../top.yaml\nimage: a\n",
				"top.yaml":        "workspace:\n  hide: [../up]\n",
			},
			want: []string{`$DIR/top.yaml:2:10: workspace.hide[0]: "../up" must stay inside the workspace (no . or .. segments)`},
		},
		"child value wins over the parent's, and is the one blamed": {
			yaml:  "extends: ./parent.yaml\nresources:\n  memory: 256m\n",
			files: map[string]string{"parent.yaml": "image: a\nresources:\n  memory: 1g\n  pids: 100\n"},
			want:  []string{"3:11: resources.memory: 256m is below the minimum of 512m"},
		},

		// Every problem, in file order.
		"several schema errors": {
			yaml: "image: a\nresources:\n  pids: many\nnetwork:\n  mode: bridged\nbogus: 1\n",
			want: []string{
				"3:9: resources.pids: got string, want integer",
				"5:9: network.mode: \"bridged\" is not one of: none, open, allowlist",
				"6:1: bogus: unknown field",
			},
		},
		"several check errors": {
			yaml: "resources: {pids: 5, cpus: 0}\nnetwork:\n  mode: none\nports: ['3000']\nenv:\n  pass: ['*']\n",
			want: []string{
				"1:1: image is required",
				"1:19: resources.pids: 5 is outside 10 .. 1000",
				"1:28: resources.cpus: 0 is below the minimum of 0.5",
				"4:8: ports: cannot be published when network.mode is none: the sandbox has only loopback",
				`6:10: env.pass[0]: unsafe grant env-glob not named in unsafe: "*" is not anchored on a name prefix: it passes host variables no one named, secrets among them`,
			},
		},
		"errors in the child first, then the parent": {
			yaml: "extends: ./parent.yaml\nresources:\n  memory: 256m\nsecurity:\n  cap_add: [ALL]\n",
			files: map[string]string{
				"parent.yaml": "image: a\nresources:\n  pids: 5000\nworkspace:\n  hide: [../x]\n",
			},
			want: []string{
				"3:11: resources.memory: 256m is below the minimum of 512m",
				"5:13: security.cap_add[0]: adding every capability undoes the sandbox",
				"$DIR/parent.yaml:3:9: resources.pids: 5000 is outside 10 .. 1000",
				`$DIR/parent.yaml:5:10: workspace.hide[0]: "../x" must stay inside the workspace (no . or .. segments)`,
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFiles(t, dir, tt.files)
			writeFiles(t, dir, map[string]string{"p.yaml": tt.yaml})
			locs := profile.Locations{ConfigDir: filepath.Join(dir, "cfg"), Workspace: filepath.Join(dir, "ws")}
			got := validate(t, locs, filepath.Join(dir, "p.yaml"), dir)
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s\nprofile:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"), tt.yaml)
			}
		})
	}
}
