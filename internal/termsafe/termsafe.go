// Package termsafe makes text from a sandbox (an agent's words, a name it
// asked for, a path it chose) inert before it reaches a terminal, and fits
// it to a width without losing its end.
//
// A terminal acts on control characters: ESC starts sequences that clear
// the screen, set the window's title or write the clipboard (OSC 52), and
// the C1 controls (U+0080 to U+009F, or those bytes raw) do the same on
// some terminals; the bidi controls reorder what is shown, so that a name
// reads as another. Inert shows each of them as an escape (\x1b, \u202e),
// as Go quotes it, and leaves everything else as it is.
//
// It depends on nothing of this module: any package may use it. It never
// writes anywhere.
package termsafe

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/mattn/go-runewidth"
)

// Unsafe reports whether a terminal could act on r, or r hides or reorders
// what is shown: the C0 controls (tab and newline too), DEL, the C1
// controls, the format characters (the bidi controls U+202A to U+202E and
// U+2066 to U+2069, the bidi marks, zero-width characters) and the line and
// paragraph separators.
func Unsafe(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Find returns the byte offset of the first character of s that Inert
// would escape (an Unsafe one, or a byte that is not UTF-8) and that
// character as Inert shows it; -1 and "" when there is none.
func Find(s string) (int, string) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return i, fmt.Sprintf(`\x%02x`, s[i])
		}
		if Unsafe(r) {
			return i, escape(r)
		}
		i += n
	}
	return -1, ""
}

// Inert returns s with every Unsafe character, and every byte that is not
// UTF-8, shown as an escape: "\x1b[2J" for ESC [2J, "\u202e" for U+202E,
// "\x9b" for the byte 0x9b. A string with none is returned as it is.
func Inert(s string) string {
	i, _ := Find(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case Unsafe(r):
			b.WriteString(escape(r))
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// escape is r as Go writes it in a quoted string: \n, \x1b, \u202e.
func escape(r rune) string {
	q := strconv.QuoteRune(r)
	return q[1 : len(q)-1]
}

// Check returns an error naming field when s holds a character Inert would
// escape, for the values that are refused rather than shown escaped.
func Check(field, s string) error {
	i, c := Find(s)
	if i < 0 {
		return nil
	}
	return fmt.Errorf("%s holds the control character %s (at byte %d): control, bidi and zero-width characters are refused, since a terminal would act on them", field, c, i)
}

// cond measures as a terminal does, whatever the locale: East Asian
// ambiguous characters are one column wide.
var cond = &runewidth.Condition{StrictEmojiNeutral: true}

// Ellipsis marks where a string was cut.
const Ellipsis = "…"

// Width is how many columns s takes on a terminal.
func Width(s string) int { return cond.StringWidth(s) }

// Left fits s in width columns by cutting its beginning, so that its end
// (a name's domain, a path's last elements) stays: "…" then the tail. A
// width of 0 or less leaves s as it is.
func Left(s string, width int) string {
	if width <= 0 || Width(s) <= width {
		return s // (runewidth's TruncatePrefix gives "…" for "")
	}
	return cond.TruncatePrefix(s, width, Ellipsis)
}

// Right fits s in width columns by cutting its end: the head then "…". A
// width of 0 or less leaves s as it is.
func Right(s string, width int) string {
	if width <= 0 || Width(s) <= width {
		return s
	}
	return cond.Truncate(s, width, Ellipsis)
}

// Pad fills s with spaces on the right to width columns.
func Pad(s string, width int) string { return cond.FillRight(s, width) }

// Wrap breaks s into lines of at most width columns, losing nothing; a
// width of 0 or less gives s as one line.
func Wrap(s string, width int) []string {
	if width <= 0 || Width(s) <= width {
		return []string{s}
	}
	return strings.Split(cond.Wrap(s, width), "\n")
}

// JSON returns a writer to w for JSON documents each written whole (as a
// json.Encoder writes them): the characters Unsafe reports that
// encoding/json leaves as they are (DEL, the C1 controls, the format and
// separator characters) are written as \u escapes, which decode to the same
// strings. (encoding/json escapes the C0 controls itself; the newlines and
// indentation between values are left as they are.)
func JSON(w io.Writer) io.Writer { return jsonWriter{w} }

type jsonWriter struct{ w io.Writer }

func (j jsonWriter) Write(p []byte) (int, error) {
	var b []byte
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if r < utf8.RuneSelf && r != 0x7f || !Unsafe(r) {
			b = append(b, p[i:i+n]...)
		} else {
			for _, u := range utf16.Encode([]rune{r}) {
				b = fmt.Appendf(b, `\u%04x`, u)
			}
		}
		i += n
	}
	if _, err := j.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Text is Inert for a file's content shown as lines: its newlines and tabs
// are kept as they are (they lay it out), everything else Inert escapes is
// escaped.
func Text(s string) string {
	if i, _ := Find(s); i < 0 {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		cells := strings.Split(l, "\t")
		for j, c := range cells {
			cells[j] = Inert(c)
		}
		lines[i] = strings.Join(cells, "\t")
	}
	return strings.Join(lines, "\n")
}

// Controls are the characters a terminal acts on that the threat model
// names, each once, for tests to feed through what shows a sandbox's text:
// every C0 control, DEL, every C1 control, and the bidi controls U+202A to
// U+202E and U+2066 to U+2069. (Unsafe reports more: the other format
// characters, the separators.)
func Controls() []rune {
	var rs []rune
	for r := rune(0); r < 0x20; r++ {
		rs = append(rs, r)
	}
	rs = append(rs, 0x7f)
	for r := rune(0x80); r <= 0x9f; r++ {
		rs = append(rs, r)
	}
	for _, r := range "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069" {
		rs = append(rs, r)
	}
	return rs
}
