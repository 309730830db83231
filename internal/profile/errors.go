package profile

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNotFound is returned (wrapped) when a named profile exists nowhere.
var ErrNotFound = errors.New("profile not found")

// Pos is a position in a profile file. Line and Col start at 1.
type Pos struct {
	File string
	Line int
	Col  int
}

func (p Pos) String() string {
	if p.Line == 0 {
		return p.File
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col)
}

// Error is one problem in a profile, at a position, about a field.
type Error struct {
	Pos   Pos
	Field string // dotted path such as network.mode or mounts[0].source; empty for the whole file
	Msg   string
	Hint  string // what to do about it, when known
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Pos.String())
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// List is every problem found in one load, in file order. It is returned as
// the error of Parse, Load and Check so that one run reports every problem.
type List []*Error

func (l List) Error() string {
	lines := make([]string, len(l))
	for i, e := range l {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find each *Error.
func (l List) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// Hints returns the distinct hints of the problems, in order.
func (l List) Hints() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range l {
		if e.Hint != "" && !seen[e.Hint] {
			seen[e.Hint] = true
			out = append(out, e.Hint)
		}
	}
	return out
}

// err returns the list as an error, or nil when it is empty.
func (l List) err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}

// fieldPath renders a schema-style path (keys and indexes) as field.path[2].
func fieldPath(path []string) string {
	var b strings.Builder
	for _, p := range path {
		if isIndex(p) {
			b.WriteString("[" + p + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

func isIndex(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
