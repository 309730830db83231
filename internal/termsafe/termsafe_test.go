package termsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// raw reports whether s holds a byte or character a terminal could act on.
func raw(s string) bool {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || Unsafe(r) {
			return true
		}
		i += n
	}
	return false
}

func TestInertEveryControl(t *testing.T) {
	t.Parallel()
	for _, r := range Controls() {
		s := "a" + string(r) + "b"
		got := Inert(s)
		if raw(got) {
			t.Errorf("Inert(%q) = %q: still raw", s, got)
		}
		if !strings.HasPrefix(got, `a\`) || !strings.HasSuffix(got, "b") {
			t.Errorf("Inert(%q) = %q: want a, an escape, b", s, got)
		}
		if i, c := Find(s); i != 1 || c != got[1:len(got)-1] {
			t.Errorf("Find(%q) = %d, %q: want 1, %q", s, i, c, got[1:len(got)-1])
		}
		if err := Check("reason", s); err == nil || !strings.Contains(err.Error(), "reason holds") {
			t.Errorf("Check(%q) = %v: want an error naming the field", s, err)
		}
	}
	// The C1 controls as raw bytes (not UTF-8), as a file name or a DNS
	// label can hold them.
	for b := 0x80; b <= 0x9f; b++ {
		s := "a" + string([]byte{byte(b)}) + "b"
		got := Inert(s)
		if raw(got) || !utf8.ValidString(got) {
			t.Errorf("Inert(%q) = %q: still raw", s, got)
		}
	}
}

func TestInert(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ in, want string }{
		"plain":         {"api.example.test:443", "api.example.test:443"},
		"clear screen":  {"\x1b[2JAll clear, nothing pending", `\x1b[2JAll clear, nothing pending`},
		"title":         {"\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
		"clipboard":     {"\x1b]52;c;ZXZpbA==\x1b\\", `\x1b]52;c;ZXZpbA==\x1b\`},
		"newline, tab":  {"a\nb\tc\r", `a\nb\tc\r`},
		"csi c1":        {"\u009b2J", `\u009b2J`},
		"csi raw byte":  {"\x9b2J", `\x9b2J`},
		"rtl override":  {"evil\u202etset.", `evil\u202etset.`},
		"isolates":      {"\u2066a\u2069", `\u2066a\u2069`},
		"zero width":    {"evil\u200b.test", `evil\u200b.test`},
		"line sep":      {"a\u2028b", `a\u2028b`},
		"cut utf-8":     {"\xe2\x80", `\xe2\x80`},
		"wide, kept":    {"日本語", "日本語"},
		"replacement":   {"\ufffd", "\ufffd"},
		"backslash":     {`C:\x`, `C:\x`},
		"empty":         {"", ""},
		"nul":           {"\x00", `\x00`},
		"del":           {"\x7f", `\x7f`},
		"astral format": {"\U000e0001", `\U000e0001`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := Inert(c.in); got != c.want {
				t.Errorf("Inert(%q) = %q, want %q", c.in, got, c.want)
			}
			if i, _ := Find(c.in); (i >= 0) != (c.in != c.want) {
				t.Errorf("Find(%q) = %d", c.in, i)
			}
		})
	}
}

func TestLeftKeepsTheEnd(t *testing.T) {
	t.Parallel()
	long := "api.anthropic.com." + strings.Repeat("x", 100) + ".evil.test:443"
	for _, w := range []int{15, 20, 40, 99} {
		got := Left(long, w)
		if !strings.HasSuffix(got, ".evil.test:443") || !strings.HasPrefix(got, Ellipsis) || Width(got) > w {
			t.Errorf("Left(long, %d) = %q (width %d): want …, the end, at most %d columns", w, got, Width(got), w)
		}
	}
	if got := Left("short", 20); got != "short" {
		t.Errorf("Left(short) = %q", got)
	}
	if got := Left("日本語のパス/最後", 8); Width(got) > 8 || !strings.HasSuffix(got, "最後") {
		t.Errorf("Left(wide, 8) = %q (width %d)", got, Width(got))
	}
	if got := Left("abc", 0); got != "abc" {
		t.Errorf("Left(abc, 0) = %q", got)
	}
}

func TestRightAndPad(t *testing.T) {
	t.Parallel()
	if got := Right("abcdefgh", 5); got != "abcd"+Ellipsis {
		t.Errorf("Right = %q", got)
	}
	if got := Right("abc", 5); got != "abc" {
		t.Errorf("Right(short) = %q", got)
	}
	if got := Pad("日本", 6); got != "日本  " {
		t.Errorf("Pad = %q", got)
	}
}

func TestWrap(t *testing.T) {
	t.Parallel()
	s := Inert("/home/u/ws/" + strings.Repeat("data/../", 20) + "etc/ssh\x1b")
	lines := Wrap(s, 30)
	if strings.Join(lines, "") != s {
		t.Fatalf("Wrap lost something: %q", lines)
	}
	for _, l := range lines {
		if Width(l) > 30 {
			t.Errorf("line of %d columns: %q", Width(l), l)
		}
	}
	if got := Wrap("short", 30); len(got) != 1 || got[0] != "short" {
		t.Errorf("Wrap(short) = %q", got)
	}
}

// JSON's output holds no raw control and decodes to the same strings.
func TestJSON(t *testing.T) {
	t.Parallel()
	var in strings.Builder
	for _, r := range Controls() {
		in.WriteRune(r)
	}
	in.WriteString("\u200b\U000e0001 ok 日本")
	var buf bytes.Buffer
	enc := json.NewEncoder(JSON(&buf))
	enc.SetIndent("", "  ")
	if err := enc.Encode(map[string]string{"reason": in.String()}); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(buf.String(), "\n") {
		if i, c := Find(l); i >= 0 {
			t.Errorf("raw %s in %q", c, l)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || back["reason"] != in.String() {
		t.Fatalf("decoded %q, %v; want %q", back["reason"], err, in.String())
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	in := "func f() {\n\treturn \"\x1b]52;c;ZXZpbA==\x07\"\r\n}\n"
	want := "func f() {\n\treturn \"\\x1b]52;c;ZXZpbA==\\a\"\\r\n}\n"
	if got := Text(in); got != want {
		t.Errorf("Text = %q, want %q", got, want)
	}
	if got := Text("plain\n\tindented\n"); got != "plain\n\tindented\n" {
		t.Errorf("Text(plain) = %q", got)
	}
}

// FuzzInert: whatever a sandbox sends, what Inert gives holds nothing a
// terminal acts on, and text that held nothing comes back as it was; Left
// and Right fit it to the width, keeping its end (Left) or its beginning
// (Right).
func FuzzInert(f *testing.F) {
	f.Add("\x1b[2JAll clear, nothing pending", uint8(10))
	f.Add("api.anthropic.com.xxxxxxxxxxxx.evil.test\u202e", uint8(20))
	f.Add("日本語\x9b\xff\u2066x", uint8(3))
	f.Fuzz(func(t *testing.T, s string, w uint8) {
		in := Inert(s)
		if i, c := Find(in); i >= 0 {
			t.Fatalf("Inert(%q) = %q holds %s at %d", s, in, c, i)
		}
		if i, _ := Find(s); i < 0 && in != s {
			t.Fatalf("Inert changed %q, which holds nothing to escape, to %q", s, in)
		}
		width := int(w%80) + 1
		for _, cut := range []struct {
			name string
			out  string
			keep func(s, part string) bool
		}{
			{"Left", Left(in, width), func(s, part string) bool { return strings.HasSuffix(s, strings.TrimPrefix(part, Ellipsis)) }},
			{"Right", Right(in, width), func(s, part string) bool { return strings.HasPrefix(s, strings.TrimSuffix(part, Ellipsis)) }},
		} {
			if Width(in) <= width {
				if cut.out != in {
					t.Fatalf("%s(%q, %d) cut what fits: %q", cut.name, in, width, cut.out)
				}
				continue
			}
			if Width(cut.out) > width {
				t.Fatalf("%s(%q, %d) = %q, %d columns", cut.name, in, width, cut.out, Width(cut.out))
			}
			if !cut.keep(in, cut.out) {
				t.Fatalf("%s(%q, %d) = %q is not a part of its end", cut.name, in, width, cut.out)
			}
		}
	})
}
