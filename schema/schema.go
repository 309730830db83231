// Package schema holds the JSON Schemas of propio-sandbox profiles and of
// `doctor --json` output, and checks decoded documents against them.
//
// The schema is the contract for users and editors; it says what a single
// profile file may contain. Checks that need more than one file (extends) or
// the host (resource bounds) live in the profile package. This package
// performs no I/O beyond reading its embedded files.
package schema

import (
	"bytes"
	_ "embed"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// ProfileJSON is the JSON Schema of a profile file, as published.
//
//go:embed profile.schema.json
var ProfileJSON []byte

// DoctorJSON is the JSON Schema of what `propio-sandbox doctor --json`
// prints.
//
//go:embed doctor.schema.json
var DoctorJSON []byte

// DoctorURL is the doctor schema's $id.
const DoctorURL = "https://propio-sandbox.dev/schema/doctor-v1.json"

// ProfileURL is the schema's $id, used in the modeline of generated profiles.
const ProfileURL = "https://propio-sandbox.dev/schema/profile-v1.json"

// Violation is one way a document breaks the schema.
type Violation struct {
	// Path is the location of the offending value: object keys and array
	// indexes as strings. For an unknown key it names the key itself.
	Path []string
	// Key is true when the violation is about a mapping key rather than its value.
	Key bool
	// Message says what is wrong, in lower case.
	Message string
}

// schemas are the embedded schemas, each compiled once, when first used:
// a launch needs only the profile's.
var schemas = map[string]func() (*jsonschema.Schema, error){
	ProfileURL: sync.OnceValues(func() (*jsonschema.Schema, error) { return compile(ProfileURL, ProfileJSON) }),
	DoctorURL:  sync.OnceValues(func() (*jsonschema.Schema, error) { return compile(DoctorURL, DoctorJSON) }),
}

func compile(url string, doc []byte) (*jsonschema.Schema, error) {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return nil, fmt.Errorf("decoding embedded schema %s: %w", url, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, v); err != nil {
		return nil, fmt.Errorf("adding embedded schema %s: %w", url, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("compiling embedded schema %s: %w", url, err)
	}
	return s, nil
}

// ValidateProfile checks a decoded profile document (maps, slices, strings,
// numbers as produced by a YAML or JSON decoder) against the profile schema.
// It returns every violation, sorted by path; none means the document is valid.
func ValidateProfile(doc any) ([]Violation, error) {
	return validate(ProfileURL, doc)
}

// ValidateDoctor checks a decoded `doctor --json` document against the
// doctor schema, as ValidateProfile does for profiles.
func ValidateDoctor(doc any) ([]Violation, error) {
	return validate(DoctorURL, doc)
}

func validate(url string, doc any) ([]Violation, error) {
	compiled, err := schemas[url]()
	if err != nil {
		return nil, err
	}
	err = compiled.Validate(doc)
	if err == nil {
		return nil, nil
	}
	verr, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return nil, fmt.Errorf("validating against %s: %w", url, err)
	}
	var out []Violation
	collect(verr, &out)
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Join(out[i].Path, "\x00") < strings.Join(out[j].Path, "\x00")
	})
	return slices.CompactFunc(out, func(a, b Violation) bool {
		return slices.Equal(a.Path, b.Path) && a.Message == b.Message && a.Key == b.Key
	}), nil
}

var printer = message.NewPrinter(language.English)

// collect flattens the error tree into its leaves, rewording the common kinds
// so that messages read as instructions to the profile's author.
func collect(e *jsonschema.ValidationError, out *[]Violation) {
	if k, ok := e.ErrorKind.(*kind.PropertyNames); ok {
		*out = append(*out, Violation{
			Path:    append(slices.Clone(e.InstanceLocation), k.Property),
			Key:     true,
			Message: fmt.Sprintf("%q is not a valid name (%s)", k.Property, patternHint(e.InstanceLocation)),
		})
		return
	}
	switch e.ErrorKind.(type) {
	case *kind.OneOf, *kind.AnyOf:
		if alternatives(e, out) {
			return
		}
	}
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			collect(c, out)
		}
		return
	}
	path := slices.Clone(e.InstanceLocation)
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		msg := "unknown field"
		if slices.Equal(path, []string{"env", "set"}) {
			// env.set's keys are variable names, checked by patternProperties
			// (propertyNames loses the location: santhosh-tekuri/jsonschema#269).
			msg = "not a valid variable name (letters, digits and _, not starting with a digit)"
		}
		for _, p := range k.Properties {
			*out = append(*out, Violation{
				Path:    append(slices.Clone(path), p),
				Key:     true,
				Message: msg,
			})
		}
		return
	case *kind.Required:
		for _, m := range k.Missing {
			*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("missing required field %q", m)})
		}
		return
	case *kind.Type:
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("got %s, want %s", k.Got, strings.Join(k.Want, " or "))})
		return
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = fmt.Sprint(w)
		}
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("%q is not one of: %s", fmt.Sprint(k.Got), strings.Join(want, ", "))})
		return
	case *kind.Const:
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("must be %v", k.Want)})
		return
	case *kind.Pattern:
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("%q is not valid here (%s)", k.Got, patternHint(path))})
		return
	case *kind.MinLength:
		*out = append(*out, Violation{Path: path, Message: "must not be empty"})
		return
	case *kind.MaxProperties:
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("%d fields, and at most %d may be set", k.Got, k.Want)})
		return
	case *kind.MinProperties:
		*out = append(*out, Violation{Path: path, Message: fmt.Sprintf("%d fields, and at least %d must be set", k.Got, k.Want)})
		return
	}
	*out = append(*out, Violation{Path: path, Message: e.ErrorKind.LocalizedString(printer)})
}

// alternatives reports the violations of a value that matches none of the
// alternatives (oneOf, anyOf) of its schema: those of the alternatives of
// its type (a string rule's, not the mapping form's "got string, want
// object"), or, when its type is none of theirs, the types it may be. It
// reports false when it cannot tell.
func alternatives(e *jsonschema.ValidationError, out *[]Violation) bool {
	var kept []*jsonschema.ValidationError
	var want []string
	got := ""
	for _, c := range e.Causes {
		if t := typeOnly(c); t != nil {
			want, got = append(want, t.Want...), t.Got
			continue
		}
		kept = append(kept, c)
	}
	if len(kept) == 0 && got != "" {
		*out = append(*out, Violation{Path: slices.Clone(e.InstanceLocation), Message: fmt.Sprintf("got %s, want %s", got, strings.Join(want, " or "))})
		return true
	}
	if len(kept) == 0 {
		return false
	}
	for _, c := range kept {
		collect(c, out)
	}
	return true
}

// typeOnly is the type mismatch e amounts to (through the references that
// lead to it), or nil when it says more.
func typeOnly(e *jsonschema.ValidationError) *kind.Type {
	for len(e.Causes) == 1 {
		e = e.Causes[0]
	}
	if t, ok := e.ErrorKind.(*kind.Type); ok && len(e.Causes) == 0 {
		return t
	}
	return nil
}

// patternHint says, for a field checked by a pattern, what is expected there.
func patternHint(path []string) string {
	field := ""
	for i := len(path) - 1; i >= 0; i-- {
		if !isIndex(path[i]) {
			field = path[i]
			break
		}
	}
	parent := ""
	if len(path) >= 2 {
		parent = path[len(path)-2]
		if isIndex(path[len(path)-1]) && len(path) >= 3 {
			parent = path[len(path)-3]
		}
	}
	switch {
	case field == "user":
		return `want host, root or "UID:GID"`
	case field == "target":
		return "want an absolute path"
	case field == "image":
		return "want an image reference without spaces"
	case field == "memory" || field == "tmp":
		return "want a size such as 512m or 2g"
	case field == "timeout":
		return "want a duration such as 90s, 30m or 2h"
	case field == "runtime":
		return "want a runtime name such as runc or runsc"
	case field == "cap_add" || field == "cap_drop":
		return "want a capability name such as NET_BIND_SERVICE or ALL"
	case field == "ports":
		return `want "PORT", "HOST:PORT" or "IP:HOST:PORT", optionally with /tcp or /udp`
	case field == "readonly" || field == "hide":
		return "want a path relative to the workspace"
	case field == "pass":
		return "want a variable name or a glob such as AWS_*"
	case field == "allow" || field == "deny" || field == "host" || field == "hosts":
		return "want a host: a name, *.name or an address, with :port if needed (no scheme or path)"
	case field == "methods":
		return "want an HTTP method in upper case, such as GET, or * for any"
	case field == "paths":
		return "want a path pattern from /, such as /repos/**"
	case field == "bandwidth":
		return "want a rate such as 10mbit (bit, kbit, mbit or gbit per second)"
	case field == "required" || parent == "set" || field == "set":
		return "want a variable name: letters, digits and _"
	}
	return "does not match the expected form"
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
