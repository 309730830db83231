package profile

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/propio/propio-sandbox/schema"
	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds a profile file; a profile is a page of YAML, never megabytes.
const MaxFileSize = 1 << 20

// Document is one parsed, schema-checked profile file, before extends is
// resolved.
type Document struct {
	File   string     // name shown in errors: a path, or builtin:NAME
	Dir    string     // directory that relative paths are resolved against; empty for built-ins
	Path   string     // absolute path of the file; empty for built-ins
	Real   string     // Path with the links of its directory resolved
	Root   *yaml.Node // the mapping node of the file
	SHA256 string     // hex digest of the file's bytes
}

// Extends returns the value of the document's extends field and its node.
func (d *Document) Extends() (string, *yaml.Node) {
	v := lookup(d.Root, "extends")
	if v == nil || v.Kind != yaml.ScalarNode {
		return "", nil
	}
	return v.Value, v
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// Parse reads one profile file and checks it against the schema. file names
// the file in errors; dir is where its relative paths point (empty for a
// built-in). Every problem is reported, as a List. When the only problems are
// schema violations the document is returned with them, so that the checks
// after the schema can still report theirs in the same run. Parse performs no
// I/O besides reading r.
func Parse(file, dir string, r io.Reader) (*Document, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	if len(data) > MaxFileSize {
		return nil, List{{Pos: Pos{File: file, Line: 1, Col: 1}, Msg: fmt.Sprintf("file is larger than %d bytes; a profile is a short YAML file", MaxFileSize)}}
	}
	sum := sha256.Sum256(data)
	doc := &Document{File: file, Dir: dir, SHA256: hex.EncodeToString(sum[:])}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var top yaml.Node
	if err := dec.Decode(&top); err != nil {
		if errors.Is(err, io.EOF) { // empty file: an empty profile
			doc.Root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1, Column: 1}
			return doc, nil
		}
		return nil, List{syntaxError(file, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, List{{Pos: Pos{File: file, Line: max(extra.Line, 1), Col: 1}, Msg: "a profile file holds one YAML document; remove the extra ---"}}
	} else if !errors.Is(err, io.EOF) {
		return nil, List{syntaxError(file, err)}
	}

	root := &top
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			doc.Root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: 1, Column: 1}
			return doc, nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		root = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: root.Line, Column: root.Column}
	}
	doc.Root = root

	var errs List
	plain, structural := toPlain(file, root)
	errs = append(errs, structural...)
	if len(structural) == 0 {
		violations, err := validateProfile(plain)
		if err != nil {
			return nil, err
		}
		for _, v := range violations {
			n := find(root, v.Path, v.Key)
			errs = append(errs, &Error{Pos: posOf(file, n), Field: fieldPath(v.Path), Msg: v.Message, Hint: schemaHint(v)})
		}
		// The schema reports by field path; a reader wants them in file order.
		slices.SortStableFunc(errs, func(a, b *Error) int {
			return cmp.Or(cmp.Compare(a.Pos.Line, b.Pos.Line), cmp.Compare(a.Pos.Col, b.Pos.Col))
		})
	}
	if len(structural) > 0 {
		return nil, errs
	}
	return doc, errs.err()
}

func schemaHint(v schema.Violation) string {
	if v.Key && v.Message == "unknown field" {
		return "unknown fields are errors so that a typo never widens access; see `propio-sandbox schema` for every field"
	}
	return ""
}

func syntaxError(file string, err error) *Error {
	line, msg := 1, err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if m[1] != "" {
			line, _ = strconv.Atoi(m[1])
			if parserError(m[2]) {
				// yaml.v3 gives a parser's (not a scanner's) mark
				// 0-based, and none for the first line.
				line++
			}
		}
		msg = m[2]
	}
	return &Error{Pos: Pos{File: file, Line: line, Col: 1}, Msg: "invalid YAML: " + msg}
}

// parserError is whether yaml.v3's message is one of its parser's (its
// parserc.go), whose line it reports 0-based, rather than its scanner's.
func parserError(msg string) bool {
	for _, p := range []string{"did not find expected ", "found undefined tag handle", "found duplicate %", "found incompatible YAML document"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func posOf(file string, n *yaml.Node) Pos {
	if n == nil {
		return Pos{File: file, Line: 1, Col: 1}
	}
	return Pos{File: file, Line: max(n.Line, 1), Col: max(n.Column, 1)}
}

// toPlain converts a node tree into the maps, slices and scalars that the
// schema validator takes. It rejects what a profile has no use for and what
// would make positions lie: anchors and aliases, merge keys, custom tags,
// duplicate and non-scalar keys.
func toPlain(file string, n *yaml.Node) (any, List) {
	var errs List
	var walk func(n *yaml.Node, path []string) any
	walk = func(n *yaml.Node, path []string) any {
		if n.Anchor != "" || n.Kind == yaml.AliasNode {
			errs = append(errs, &Error{Pos: posOf(file, n), Msg: "YAML anchors and aliases are not supported in profiles; use extends to share settings"})
			return nil
		}
		switch n.Kind {
		case yaml.MappingNode:
			m := make(map[string]any, len(n.Content)/2)
			first := map[string]*yaml.Node{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				if k.Kind != yaml.ScalarNode {
					errs = append(errs, &Error{Pos: posOf(file, k), Msg: "mapping keys must be plain names"})
					continue
				}
				if k.Tag == "!!merge" {
					errs = append(errs, &Error{Pos: posOf(file, k), Msg: "YAML merge keys (<<) are not supported in profiles; use extends to share settings"})
					continue
				}
				if prev, dup := first[k.Value]; dup {
					errs = append(errs, &Error{Pos: posOf(file, k), Field: fieldPath(append(slices.Clip(path), k.Value)), Msg: fmt.Sprintf("duplicate key, first set at line %d", prev.Line)})
					continue
				}
				first[k.Value] = k
				m[k.Value] = walk(v, append(slices.Clip(path), k.Value))
			}
			return m
		case yaml.SequenceNode:
			s := make([]any, 0, len(n.Content))
			for i, c := range n.Content {
				s = append(s, walk(c, append(slices.Clip(path), strconv.Itoa(i))))
			}
			return s
		case yaml.ScalarNode:
			switch n.Tag {
			case "!!str", "!!binary", "":
				return n.Value
			case "!!null":
				return nil
			case "!!bool":
				var b bool
				if err := n.Decode(&b); err != nil {
					return n.Value
				}
				return b
			case "!!int":
				if i, err := strconv.ParseInt(n.Value, 0, 64); err == nil {
					return i
				}
				var f float64
				if err := n.Decode(&f); err == nil {
					return f
				}
				return n.Value
			case "!!float":
				var f float64
				if err := n.Decode(&f); err != nil {
					return n.Value
				}
				return f
			case "!!timestamp":
				return n.Value
			}
			errs = append(errs, &Error{Pos: posOf(file, n), Msg: fmt.Sprintf("YAML tag %s is not supported in profiles", n.Tag)})
			return nil
		}
		errs = append(errs, &Error{Pos: posOf(file, n), Msg: "unexpected YAML node"})
		return nil
	}
	v := walk(n, nil)
	return v, errs
}

// lookup returns the value node of key in a mapping node, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// lookupKey returns the key node of key in a mapping node, or nil.
func lookupKey(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i]
		}
	}
	return nil
}

// find walks path (keys and indexes) from n and returns the deepest node
// reached: the value, or the key when key is true and the walk completes.
func find(n *yaml.Node, path []string, key bool) *yaml.Node {
	cur := n
	for i, p := range path {
		switch cur.Kind {
		case yaml.MappingNode:
			next := lookup(cur, p)
			if next == nil {
				return cur
			}
			if i == len(path)-1 && key {
				return lookupKey(cur, p)
			}
			cur = next
		case yaml.SequenceNode:
			idx, err := strconv.Atoi(p)
			if err != nil || idx < 0 || idx >= len(cur.Content) {
				return cur
			}
			cur = cur.Content[idx]
		default:
			return cur
		}
	}
	return cur
}
