package profile

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// TrustedBase is what p builds on that needs no trust: the first profile of
// its extends chain outside workspace (a built-in or a user profile), with
// what that extends, resolved. When every file of the chain is in the
// workspace it is a profile of the defaults alone (Meta.File "the
// defaults"). What p grants beyond it is what trust asks the user to
// review.
func (p *Profile) TrustedBase(workspace string) (*Profile, error) {
	if p.src == nil {
		return nil, fmt.Errorf("%s was not loaded from files", p.Meta.File)
	}
	chain := p.src.chain
	i := slices.IndexFunc(chain, func(d *Document) bool { return !inWorkspace(workspace, d.Path, d.Real) })
	if i < 0 {
		empty := &Document{File: "the defaults", Root: &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}}
		chain = []*Document{empty}
	} else {
		chain = chain[i:]
	}
	base, problems, err := decodeChain(chain[0].File, chain, nil, p.src.workspace, p.src.configDir)
	switch {
	case err != nil:
		return nil, err
	case len(problems) > 0:
		return nil, problems
	}
	return base, nil
}

// Delta lists, a line each, how p differs from base, both after extends and
// defaults (its description aside, which grants nothing): a field p sets or changes ("network.mode: open (was none)"),
// each item it adds to a list ("env.pass += GOFLAGS"), a list it replaces
// ("command: [make, test] (was [bash])") and a field it drops ("build:
// unset (was ...)").
func Delta(base, p *Profile) ([]string, error) {
	var from, to yaml.Node
	for _, x := range []struct {
		p *Profile
		n *yaml.Node
	}{{base, &from}, {p, &to}} {
		out, err := x.p.YAML()
		if err != nil {
			return nil, err
		}
		if err := yaml.Unmarshal(out, x.n); err != nil {
			return nil, fmt.Errorf("reading profile: %w", err)
		}
	}
	was, wasOrder := flatten(&from)
	now, nowOrder := flatten(&to)
	var lines []string
	for _, path := range nowOrder {
		if path != "description" {
			lines = append(lines, deltaOf(path, was[path], now[path])...)
		}
	}
	for _, path := range wasOrder {
		if now[path] == nil && path != "description" {
			lines = append(lines, fmt.Sprintf("%s: unset (was %s)", path, flow(was[path])))
		}
	}
	return lines, nil
}

func deltaOf(path string, was, now *yaml.Node) []string {
	if now.Kind != yaml.SequenceNode || replaced[path] {
		switch {
		case was == nil:
			return []string{path + ": " + flow(now)}
		case flow(was) != flow(now):
			return []string{fmt.Sprintf("%s: %s (was %s)", path, flow(now), flow(was))}
		}
		return nil
	}
	var before []string
	if was != nil && was.Kind == yaml.SequenceNode {
		for _, n := range was.Content {
			before = append(before, flow(n))
		}
	}
	var after []string
	for _, n := range now.Content {
		after = append(after, flow(n))
	}
	if was != nil && slices.ContainsFunc(before, func(s string) bool { return !slices.Contains(after, s) }) {
		return []string{fmt.Sprintf("%s: %s (was %s)", path, flow(now), flow(was))}
	}
	var lines []string
	for _, s := range after {
		if !slices.Contains(before, s) {
			lines = append(lines, path+" += "+s)
		}
	}
	return lines
}

// flatten maps the dotted path of every scalar and list of a YAML document
// to its node, and lists the paths in document order.
func flatten(doc *yaml.Node) (map[string]*yaml.Node, []string) {
	out := map[string]*yaml.Node{}
	var order []string
	var walk func(prefix string, n *yaml.Node)
	walk = func(prefix string, n *yaml.Node) {
		if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
			walk(prefix, n.Content[0])
			return
		}
		if n.Kind != yaml.MappingNode || prefix == "build" {
			out[prefix] = n
			order = append(order, prefix)
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			if prefix != "" {
				key = prefix + "." + key
			}
			walk(key, n.Content[i+1])
		}
	}
	walk("", doc)
	return out, order
}

// flow writes a node on one line, as YAML's flow style does.
func flow(n *yaml.Node) string {
	c := *n
	setFlow(&c)
	out, err := yaml.Marshal(&c)
	if err != nil {
		return n.Value
	}
	return strings.TrimSpace(string(out))
}

func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
}
