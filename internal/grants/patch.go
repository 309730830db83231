package grants

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrAlreadyThere is returned by PatchProfile when the list holds the rule.
var ErrAlreadyThere = errors.New("the rule is there already")

// PatchProfile adds rule to network.LIST (list is "allow" or "deny") of a
// profile file's content, as a patch at the right line that keeps the rest
// of the file as it is, comments and formatting included: an item after the
// list's last one (inside [ ] for a list written on one line), the list
// after network's last field when network has none, a network section at
// the end when the file has none. file names the content in errors.
func PatchProfile(file string, data []byte, list, rule string) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: not a profile (a mapping of fields)", file)
	}
	doc := root.Content[0]
	lines := splitLines(data)
	e := editor{file: file, lines: lines, unit: indentUnit(doc)}
	key, network := pair(doc, "network")
	var err error
	switch {
	case network == nil:
		err = e.insert(len(lines), 0, "network:", e.unit, list+":", 2*e.unit, "- "+quote(rule, false))
	case network.Kind == yaml.ScalarNode && network.Tag == "!!null":
		col := key.Column - 1
		err = e.insert(key.Line, col+e.unit, list+":", col+2*e.unit, "- "+quote(rule, false))
	case network.Kind != yaml.MappingNode || network.Style&yaml.FlowStyle != 0:
		err = fmt.Errorf("%s:%d:%d: network is not written as a block of fields, one a line: write it so, and try again", file, key.Line, key.Column)
	default:
		err = e.addToNetwork(network, list, rule)
	}
	if err != nil {
		return nil, err
	}
	out := []byte(strings.Join(e.lines, ""))
	if err := checkPatched(file, out, list, rule); err != nil {
		return nil, err
	}
	return out, nil
}

// addToNetwork adds rule to list in the network mapping.
func (e *editor) addToNetwork(network *yaml.Node, list, rule string) error {
	key, seq := pair(network, list)
	col := network.Content[0].Column - 1 // network's fields
	switch {
	case seq == nil:
		return e.insert(lastLine(network), col, list+":", col+e.unit, "- "+quote(rule, false))
	case seq.Kind == yaml.ScalarNode && seq.Tag == "!!null":
		return e.insert(key.Line, col+e.unit, "- "+quote(rule, false))
	case seq.Kind != yaml.SequenceNode:
		return fmt.Errorf("%s:%d:%d: network.%s is not a list", e.file, seq.Line, seq.Column, list)
	}
	for _, item := range seq.Content {
		if item.Value == rule {
			return fmt.Errorf("%s:%d:%d: network.%s: %q: %w", e.file, item.Line, item.Column, list, rule, ErrAlreadyThere)
		}
	}
	if seq.Style&yaml.FlowStyle != 0 {
		return e.addToFlow(key, seq, rule)
	}
	last := seq.Content[len(seq.Content)-1]
	text := e.lines[last.Line-1]
	dash := len(text) - len(strings.TrimLeft(text, " "))
	if !strings.HasPrefix(text[dash:], "- ") || dash+2 != last.Column-1 {
		return fmt.Errorf("%s:%d:%d: network.%s: write one item a line, as - %s, and try again", e.file, last.Line, last.Column, list, quote(rule, false))
	}
	return e.insert(lastLine(last), dash, "- "+quote(rule, last.Style == yaml.DoubleQuotedStyle))
}

// addToFlow adds rule before the ] of a list written on one line.
func (e *editor) addToFlow(key, seq *yaml.Node, rule string) error {
	line := e.lines[seq.Line-1]
	open := seq.Column - 1
	end := strings.IndexByte(line[open:], ']')
	if open >= len(line) || line[open] != '[' || end < 0 || strings.Contains(line[open:open+end], "#") {
		return fmt.Errorf("%s:%d:%d: network.%s is written over several lines in [ ]: write it on one line, or one item a line, and try again", e.file, key.Line, key.Column, key.Value)
	}
	end += open
	double := len(seq.Content) > 0 && seq.Content[len(seq.Content)-1].Style == yaml.DoubleQuotedStyle
	item := quote(rule, double)
	if len(seq.Content) > 0 {
		item = ", " + item
	}
	e.lines[seq.Line-1] = line[:end] + item + line[end:]
	return nil
}

// editor inserts lines into a file's lines.
type editor struct {
	file  string
	lines []string // each with its line ending
	unit  int      // the file's indentation step
}

// insert puts lines after line after (0: at the start), each given by its
// indentation then its text, as: col, text, col, text...
func (e *editor) insert(after int, parts ...any) error {
	var add []string
	for i := 0; i+1 < len(parts); i += 2 {
		add = append(add, strings.Repeat(" ", parts[i].(int))+parts[i+1].(string)+"\n")
	}
	if after > 0 && !strings.HasSuffix(e.lines[after-1], "\n") {
		e.lines[after-1] += "\n"
	}
	e.lines = append(e.lines[:after], append(add, e.lines[after:]...)...)
	return nil
}

// pair returns the key and value nodes of key in mapping n.
func pair(n *yaml.Node, key string) (*yaml.Node, *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i], n.Content[i+1]
		}
	}
	return nil, nil
}

// lastLine is the last line a node's content is on.
func lastLine(n *yaml.Node) int {
	line := n.Line
	for _, c := range n.Content {
		line = max(line, lastLine(c))
	}
	return line
}

// indentUnit is the indentation of the first nested block mapping of doc,
// else 2.
func indentUnit(doc *yaml.Node) int {
	for i := 1; i < len(doc.Content); i += 2 {
		v := doc.Content[i]
		if v.Kind == yaml.MappingNode && v.Style&yaml.FlowStyle == 0 && len(v.Content) > 0 {
			if u := v.Content[0].Column - doc.Content[i-1].Column; u > 0 {
				return u
			}
		}
	}
	return 2
}

// quote writes rule as a YAML scalar: plain where YAML reads it back as the
// same string, else double-quoted (always, with double).
func quote(rule string, double bool) string {
	if double || strings.HasPrefix(rule, "*") || strings.HasPrefix(rule, "[") {
		return strconv.Quote(rule)
	}
	return rule
}

// splitLines splits data after each newline, keeping them.
func splitLines(data []byte) []string {
	var lines []string
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			lines = append(lines, string(data))
			break
		}
		lines = append(lines, string(data[:i+1]))
		data = data[i+1:]
	}
	return lines
}

// checkPatched makes sure the patched content parses and its list holds
// rule: a patch that would not is a bug, never written.
func checkPatched(file string, data []byte, list, rule string) error {
	var v struct {
		Network struct {
			Allow []string `yaml:"allow"`
			Deny  []string `yaml:"deny"`
		} `yaml:"network"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("%s: the patch would not parse (%v): add the rule by hand", file, err)
	}
	got := v.Network.Allow
	if list == "deny" {
		got = v.Network.Deny
	}
	for _, r := range got {
		if r == rule {
			return nil
		}
	}
	return fmt.Errorf("%s: the patch would not add %q to network.%s: add it by hand", file, rule, list)
}

// Diff is a unified diff of old and new, as a patch of file: one hunk
// around what changed, with three lines of context.
func Diff(file string, old, new []byte) string {
	a, b := splitLines(old), splitLines(new)
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	if pre == len(a) && pre == len(b) {
		return ""
	}
	start := max(pre-3, 0)
	endA, endB := min(len(a)-suf+3, len(a)), min(len(b)-suf+3, len(b))
	var w strings.Builder
	fmt.Fprintf(&w, "--- %s\n+++ %s\n@@ -%s +%s @@\n", file, file, hunkRange(start, endA-start), hunkRange(start, endB-start))
	line := func(prefix, s string) {
		w.WriteString(prefix + s)
		if !strings.HasSuffix(s, "\n") {
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
	for _, s := range a[start:pre] {
		line(" ", s)
	}
	for _, s := range a[pre : len(a)-suf] {
		line("-", s)
	}
	for _, s := range b[pre : len(b)-suf] {
		line("+", s)
	}
	for _, s := range b[len(b)-suf : endB] {
		line(" ", s)
	}
	return w.String()
}

// hunkRange writes a hunk's start and length as diff does.
func hunkRange(start, n int) string {
	if n == 0 {
		return strconv.Itoa(start) + ",0"
	}
	if n == 1 {
		return strconv.Itoa(start + 1)
	}
	return strconv.Itoa(start+1) + "," + strconv.Itoa(n)
}
