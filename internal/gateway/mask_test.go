package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// maskValue has characters that each encoding changes.
const maskValue = "sk-e2e/Ab+Cd=Ef&Gh<0123456789xyz"

func testMatcher(values ...string) *matcher {
	var secrets []liveSecret
	for i, v := range values {
		secrets = append(secrets, liveSecret{SecretHosts: SecretHosts{Name: fmt.Sprintf("S%d", i)}, value: v})
	}
	return newMatcher(secrets)
}

// TestMatcherForms: the value comes back masked as it is and in every form
// a server or the gateway may put it in: base64 (standard and URL-safe, the
// gateway's Basic credential of user:value for users of every length),
// percent-encoded, hex, JSON-escaped; each occurrence is one fixed mask.
func TestMatcherForms(t *testing.T) {
	t.Parallel()
	m := testMatcher(maskValue)
	b64 := func(enc *base64.Encoding, s string) string { return enc.EncodeToString([]byte(s)) }
	j, _ := json.Marshal(maskValue)
	forms := map[string]string{
		"as it is":      maskValue,
		"query escaped": url.QueryEscape(maskValue),
		"path escaped":  url.PathEscape(maskValue),
		"hex":           hex.EncodeToString([]byte(maskValue)),
		"HEX":           strings.ToUpper(hex.EncodeToString([]byte(maskValue))),
		"json":          string(j[1 : len(j)-1]),
	}
	for _, user := range []string{"", "x", "xy", "x-access-token", "user"} {
		forms["basic "+user] = b64(base64.StdEncoding, user+":"+maskValue)
		forms["url-safe "+user] = b64(base64.URLEncoding, user+":"+maskValue)
		forms["base64 after "+user] = b64(base64.StdEncoding, user+maskValue+"\n")
	}
	for name, f := range forms {
		t.Run(name, func(t *testing.T) {
			var masked []string
			out := m.maskString("before "+f+" after", &masked)
			// What is left of the form is at most a character or two at
			// either end (of the user's part, or mixed with a neighbour).
			rest := strings.TrimSuffix(strings.TrimPrefix(out, "before "), " after")
			left, right, ok := strings.Cut(rest, maskFor("S0"))
			if !ok || strings.Contains(right, "[masked") || len(right) > 4 || !slices.Equal(masked, []string{"S0"}) {
				t.Errorf("%q became %q (masked %v), want one mask", f, out, masked)
			}
			if len(left) > len(f)-len(maskValue) {
				t.Errorf("%q: %q is left before the mask", f, left)
			}
		})
	}
}

// TestMatcherRuns: any 8 or more consecutive characters of the value are
// masked, a shorter piece is not; the mask's length says nothing of the
// value's; a value shorter than 8 is masked whole; overlapping and adjacent
// runs are one mask.
func TestMatcherRuns(t *testing.T) {
	t.Parallel()
	m := testMatcher(maskValue)
	for i := 0; i+runLen <= len(maskValue); i++ {
		for j := i + runLen; j <= len(maskValue); j++ {
			var masked []string
			if out := m.maskString("("+maskValue[i:j]+")", &masked); out != "("+maskFor("S0")+")" {
				t.Fatalf("%q became %q, want it masked", maskValue[i:j], out)
			}
		}
	}
	var masked []string
	for i := 0; i+runLen-1 <= len(maskValue); i++ {
		piece := "(" + maskValue[i:i+runLen-1] + ")"
		if out := m.maskString(piece, &masked); out != piece {
			t.Errorf("%q, 7 characters, became %q", piece, out)
		}
	}
	if len(masked) != 0 {
		t.Errorf("masked %v, want nothing", masked)
	}
	// Two parts of the value side by side: one mask.
	if out := m.maskString(maskValue[20:]+maskValue[:10], &masked); out != maskFor("S0") {
		t.Errorf("two runs side by side became %q", out)
	}
	short := testMatcher("abc12", strings.Repeat("q", 40))
	if out := short.maskString("xabc12y abc1 "+strings.Repeat("q", 8), &masked); out != "x"+maskFor("S0")+"y abc1 "+maskFor("S1") {
		t.Errorf("a short value: %q", out)
	}
	// The mask is as long whatever the value's length.
	long := testMatcher(maskValue + maskValue)
	if a, b := m.maskString(maskValue, &masked), long.maskString(maskValue+maskValue, &masked); a != b {
		t.Errorf("values of two lengths masked as %q and %q", a, b)
	}
}

// TestMaskerStreams: whatever the reads, a body comes out as it does whole:
// a run split across reads, or going on across them, is one mask.
func TestMaskerStreams(t *testing.T) {
	t.Parallel()
	m := testMatcher(maskValue, "xyz")
	basic := base64.StdEncoding.EncodeToString([]byte("x:" + maskValue))
	in := "0" + maskValue + "1" + maskValue[3:] + maskValue[:9] + "2xyz3 Basic " + basic + " 4" + maskValue[:7] + "5sk-e2e/Ab"
	var masked []string
	want := m.maskString(in, &masked)
	if strings.Count(want, "[masked:S0]") != 4 || strings.Count(want, "[masked:S1]") != 1 || !strings.HasSuffix(want, "5"+maskFor("S0")) {
		t.Fatalf("whole: %q", want)
	}
	for chunk := 1; chunk <= len(in); chunk++ {
		var masked []string
		trailer := http.Header{"X-T": {"tail " + maskValue}}
		var r io.Reader = &chunked{s: in, n: chunk}
		if chunk == 1 {
			r = iotest.OneByteReader(strings.NewReader(in))
		}
		out, err := io.ReadAll(newMasker(io.NopCloser(r), m, trailer, &masked))
		if err != nil || string(out) != want {
			t.Fatalf("chunks of %d: %q, %v\nwant %q", chunk, out, err, want)
		}
		if !slices.Equal(masked, []string{"S0", "S1"}) || trailer.Get("X-T") != "tail "+maskFor("S0") {
			t.Fatalf("chunks of %d: masked %v, trailer %q", chunk, masked, trailer.Get("X-T"))
		}
	}
	// Read a byte at a time.
	out, err := io.ReadAll(iotest.OneByteReader(newMasker(io.NopCloser(&chunked{s: in, n: 5}), m, nil, &masked)))
	if err != nil || string(out) != want {
		t.Errorf("read a byte at a time: %q, %v", out, err)
	}
	// An event ending in no beginning of a run is given at once.
	pr, pw := io.Pipe()
	k := newMasker(pr, m, nil, &masked)
	go pw.Write([]byte("data: x\n\n"))
	buf := make([]byte, 64)
	done := make(chan int)
	go func() { n, _ := k.Read(buf); done <- n }()
	select {
	case n := <-done:
		if string(buf[:n]) != "data: x\n\n" {
			t.Errorf("read %q", buf[:n])
		}
	case <-time.After(ioTimeout):
		t.Fatal("the masker held back a whole event")
	}
	pw.Close()
}

// TestMaskResponse: a body the upstream encoded although asked for
// identity is decoded (gzip, deflate as zlib or raw, several in a row), then
// masked; the response loses its Content-Encoding and Content-Length; one
// the gateway cannot decode is not sent.
func TestMaskResponse(t *testing.T) {
	t.Parallel()
	body := "you sent Bearer " + maskValue
	pack := func(w func(io.Writer) io.WriteCloser) func([]byte) []byte {
		return func(b []byte) []byte {
			var buf bytes.Buffer
			zw := w(&buf)
			zw.Write(b)
			zw.Close()
			return buf.Bytes()
		}
	}
	gz := pack(func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
	zl := pack(func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
	raw := pack(func(w io.Writer) io.WriteCloser { zw, _ := flate.NewWriter(w, flate.BestSpeed); return zw })
	for name, tc := range map[string]struct {
		encoding string
		body     []byte
		err      string
	}{
		"identity":     {"", []byte(body), ""},
		"gzip":         {"gzip", gz([]byte(body)), ""},
		"x-gzip":       {"x-gzip", gz([]byte(body)), ""},
		"deflate":      {"deflate", zl([]byte(body)), ""},
		"raw deflate":  {"Deflate", raw([]byte(body)), ""},
		"gzip twice":   {"gzip, identity, gzip", gz(gz([]byte(body))), ""},
		"deflate gzip": {"deflate, gzip", gz(zl([]byte(body))), ""},
		"br":           {"br", []byte("\x0b\x02\x80hello\x03"), `Content-Encoding "br", which the gateway cannot decode`},
		"bad gzip":     {"gzip", []byte("not gzip"), "decoding the upstream's gzip body"},
	} {
		t.Run(name, func(t *testing.T) {
			resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Length": {fmt.Sprint(len(tc.body))}},
				Body: io.NopCloser(bytes.NewReader(tc.body)), ContentLength: int64(len(tc.body))}
			if tc.encoding != "" {
				resp.Header.Set("Content-Encoding", tc.encoding)
			}
			var masked []string
			err := maskResponse(resp, testMatcher(maskValue), &masked)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "the body is not sent") {
					t.Errorf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil || string(out) != "you sent Bearer "+maskFor("S0") {
				t.Errorf("body %q, %v", out, err)
			}
			if resp.ContentLength != -1 || resp.Header.Get("Content-Length") != "" || resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("length %d, headers %v: want no length and no encoding", resp.ContentLength, resp.Header)
			}
		})
	}
}

// TestAskWhole: a request to a host a value may come back from asks for
// no encoding and no range.
func TestAskWhole(t *testing.T) {
	t.Parallel()
	h := http.Header{"Accept-Encoding": {"gzip, br"}, "Range": {"bytes=10-16"}, "If-Range": {`"x"`}, "X-Other": {"1"}}
	askWhole(h)
	if want := (http.Header{"Accept-Encoding": {"identity"}, "X-Other": {"1"}}); fmt.Sprint(h) != fmt.Sprint(want) {
		t.Errorf("headers %v, want %v", h, want)
	}
}

// BenchmarkMasker: a megabyte of text with no value in it, through the
// masker.
func BenchmarkMasker(b *testing.B) {
	m := testMatcher(maskValue, "sk-ant-api03-"+strings.Repeat("AbCdEfGh", 12))
	text := bytes.Repeat([]byte("data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"Hello, world 0123\"}}\n\n"), 1<<20/80)
	b.SetBytes(int64(len(text)))
	buf := make([]byte, copyBufferSize)
	var masked []string
	for b.Loop() {
		k := newMasker(io.NopCloser(bytes.NewReader(text)), m, nil, &masked)
		for {
			if _, err := k.Read(buf); err != nil {
				break
			}
		}
	}
}

// FuzzMasker: whatever the body, the secret's value and the reads, no run of
// runLen characters of the value comes out, and a body read in pieces is
// masked as it is whole. The value is drawn from characters the mask itself
// does not hold, so that a run found in the output can only be the value's.
func FuzzMasker(f *testing.F) {
	f.Add("sk-e2e/AbCdEfGhIjKl", []byte("you sent Bearer sk-e2e/AbCdEfGhIjKl"), uint8(3))
	f.Add("0123456789", []byte("x0123456789y 01234567 123456789"), uint8(1))
	f.Add("ZZZZZZZZZZZZ", []byte("ZZZZZZZZZZZZZZZZZZZZZZZZ"), uint8(7))
	f.Fuzz(func(t *testing.T, value string, body []byte, chunk uint8) {
		value = strings.Map(func(r rune) rune {
			if r > 0x7e || r < 0x21 || strings.ContainsRune("[masked:S0]", r) {
				return -1
			}
			return r
		}, value)
		if len(value) < runLen || len(value) > 256 || len(body) > 1<<16 {
			return
		}
		m := testMatcher(value)
		var masked []string
		whole := m.maskString(string(body), &masked)
		for i := 0; i+runLen <= len(value); i++ {
			if strings.Contains(whole, value[i:i+runLen]) {
				t.Fatalf("value %q: a run %q is in %q", value, value[i:i+runLen], whole)
			}
		}
		n := int(chunk)%32 + 1
		out, err := io.ReadAll(newMasker(io.NopCloser(&chunked{s: string(body), n: n}), m, nil, &masked))
		if err != nil || string(out) != whole {
			t.Fatalf("value %q, reads of %d: %q, %v; whole: %q", value, n, out, err, whole)
		}
	})
}
