package gateway

// Masking the real values of secrets in what a secret's host answers. A
// value may come back as it is, in part, or in an encoding a server (or the
// gateway itself, building a Basic credential) put it in; the matcher knows
// each value's forms and masks every run of runLen or more consecutive
// characters of any of them, each run with one mask of a fixed length, so
// that neither a piece of the value nor its length reaches the sandbox.

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// runLen is the shortest run of a value's characters (or of one of its
// forms) that is masked; a value shorter than that is masked whole.
const runLen = 8

// maskFor is the mask a run of secret name's value becomes: its length
// depends on the name alone.
func maskFor(name string) string { return "[masked:" + name + "]" }

// valueForms are the forms a value may come back in: as it is; in base64,
// standard and URL-safe, at each of the three alignments it can have in a
// longer stream (a Basic credential's user:value shifts it), the characters
// that mix in a neighbour's bits left out; percent-encoded, in a query and
// a path; in hex, lower and upper case; and escaped in a JSON string.
func valueForms(v string) []string {
	forms := []string{v}
	add := func(f string) {
		for _, have := range forms {
			if have == f {
				return
			}
		}
		forms = append(forms, f)
	}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for a := range 3 {
			bits := 8 * (a + len(v))
			s := enc.EncodeToString(append(make([]byte, a), v...))
			if from, to := (8*a+5)/6, bits/6; to > from {
				add(s[from:to])
			}
		}
	}
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	add(hex.EncodeToString([]byte(v)))
	add(strings.ToUpper(hex.EncodeToString([]byte(v))))
	if j, err := json.Marshal(v); err == nil {
		add(string(j[1 : len(j)-1]))
	}
	return forms
}

// matcher finds, in bytes, the runs of the values of some secrets (and of
// their forms).
type matcher struct {
	names []string
	// runs holds every runLen bytes of every form of a value at least
	// runLen long, as a little-endian word, with its secret's index + 1;
	// first has a bit for each of their first two bytes, a quick no.
	runs  map[uint64]uint16
	first [1 << 16 / 64]uint64
	// whole are the forms shorter than runLen: the value itself, or an
	// encoding of a short value, masked only whole.
	whole []wholeForm
	// begins[k] holds the first k bytes of each run and whole form: an end
	// of a stream that is one of them is held until more comes.
	begins [runLen]map[string]bool
}

type wholeForm struct {
	text   []byte
	secret uint16 // index + 1
}

// minWhole is how short a form of a short value may be and still be
// masked, the value itself aside: shorter, it would mask ordinary text.
const minWhole = 6

func newMatcher(secrets []liveSecret) *matcher {
	m := &matcher{runs: map[uint64]uint16{}}
	for k := 1; k < runLen; k++ {
		m.begins[k] = map[string]bool{}
	}
	for i, s := range secrets {
		m.names = append(m.names, s.Name)
		for _, f := range valueForms(s.value) {
			switch {
			case len(f) >= runLen:
				for j := 0; j+runLen <= len(f); j++ {
					m.addRun(f[j:j+runLen], uint16(i+1))
				}
			case f == s.value || len(f) >= minWhole:
				m.whole = append(m.whole, wholeForm{text: []byte(f), secret: uint16(i + 1)})
				for k := 1; k < min(len(f), runLen); k++ {
					m.begins[k][f[:k]] = true
				}
			}
		}
	}
	return m
}

func (m *matcher) addRun(r string, secret uint16) {
	w := binary.LittleEndian.Uint64([]byte(r))
	if _, ok := m.runs[w]; !ok {
		m.runs[w] = secret
	}
	m.first[uint16(w)/64] |= 1 << (uint16(w) % 64)
	for k := 1; k < runLen; k++ {
		m.begins[k][r[:k]] = true
	}
}

// mark sets owner[i] to the secret (index + 1) of each byte of b in a run of
// a value or a whole short form; the others it leaves as they are.
func (m *matcher) mark(b []byte, owner []uint16) {
	for i := 0; i+runLen <= len(b); i++ {
		w := binary.LittleEndian.Uint64(b[i:])
		if m.first[uint16(w)/64]&(1<<(uint16(w)%64)) == 0 {
			continue
		}
		if s, ok := m.runs[w]; ok {
			for j := i; j < i+runLen; j++ {
				owner[j] = s
			}
		}
	}
	for _, f := range m.whole {
		for from := 0; ; {
			i := bytes.Index(b[from:], f.text)
			if i < 0 {
				break
			}
			for j := from + i; j < from+i+len(f.text); j++ {
				owner[j] = f.secret
			}
			from += i + 1
		}
	}
}

// pending is the length of the longest end of b that begins a run or a
// whole form: what follows decides whether it is masked.
func (m *matcher) pending(b []byte) int {
	for k := min(runLen-1, len(b)); k > 0; k-- {
		if m.begins[k][string(b[len(b)-k:])] {
			return k
		}
	}
	return 0
}

// emit appends b to out with each run of marked bytes (owner) replaced by
// its mask, and notes the secrets masked. A run that begins b goes on the
// one that ended the last emit when inRun: it gets no second mask. It
// returns whether b ended in a run.
func (m *matcher) emit(out, b []byte, owner []uint16, inRun bool, masked *[]string) ([]byte, bool) {
	for i := 0; i < len(b); {
		j := i
		if owner[i] == 0 {
			for j < len(b) && owner[j] == 0 {
				j++
			}
			out = append(out, b[i:j]...)
			inRun = false
			i = j
			continue
		}
		for j < len(b) && owner[j] != 0 {
			*masked = appendOnce(*masked, m.names[owner[j]-1])
			j++
		}
		if !inRun || i > 0 {
			out = append(out, maskFor(m.names[owner[i]-1])...)
		}
		inRun = true
		i = j
	}
	return out, inRun
}

// maskString is s with every run masked.
func (m *matcher) maskString(s string, masked *[]string) string {
	b := []byte(s)
	owner := make([]uint16, len(b))
	m.mark(b, owner)
	for _, o := range owner {
		if o != 0 {
			out, _ := m.emit(nil, b, owner, false, masked)
			return string(out)
		}
	}
	return s
}

// maskHeaders masks the runs in h's names and values, in place.
func (m *matcher) maskHeaders(h http.Header, masked *[]string) {
	renamed := map[string]string{}
	for name, vals := range h {
		for i, v := range vals {
			vals[i] = m.maskString(v, masked)
		}
		if n := m.maskString(name, masked); n != name {
			renamed[name] = n
		}
	}
	for name, n := range renamed {
		h[n] = append(h[n], h[name]...)
		delete(h, name)
	}
}

// askWhole makes a request to a host a value may come back from ask for
// its answer in no encoding the gateway cannot see through, and whole, not
// a range of it at a time (a few characters of a value per request).
func askWhole(h http.Header) {
	h.Set("Accept-Encoding", "identity")
	h.Del("Range")
	h.Del("If-Range")
}

// maskResponse masks the runs of m in resp's headers and, as it streams, in
// its body (decoded first when the upstream encoded it although asked for
// identity) and trailers. Masked, the body has no length of its own: the
// response loses its Content-Length.
func maskResponse(resp *http.Response, m *matcher, masked *[]string) error {
	body, err := decoded(resp)
	if err != nil {
		return err
	}
	resp.Body = body
	m.maskHeaders(resp.Header, masked)
	// An upgraded connection (a WebSocket) carries frames both ways, which
	// are copied as they are.
	if body != nil && body != http.NoBody && resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body = newMasker(gathered(resp), m, resp.Trailer, masked)
		resp.ContentLength = -1
	}
	resp.Header.Del("Content-Length")
	return nil
}

// decoded is the body of resp without the Content-Encoding the upstream
// gave it (none is asked for: it may still give one), which the response
// loses: gzip and deflate are decoded, as each was applied, last first; an
// encoding the gateway cannot decode is an error, and the body is not sent.
func decoded(resp *http.Response) (io.ReadCloser, error) {
	var codings []string
	for _, v := range resp.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	resp.Header.Del("Content-Encoding")
	body := resp.Body
	if len(codings) == 0 || body == nil || body == http.NoBody {
		return body, nil
	}
	var r io.Reader = body
	for i := len(codings) - 1; i >= 0; i-- {
		var err error
		switch codings[i] {
		case "gzip", "x-gzip":
			r, err = gzip.NewReader(r)
		case "deflate":
			r, err = inflater(r)
		default:
			body.Close()
			return nil, fmt.Errorf("the upstream answered in Content-Encoding %q, which the gateway cannot decode to mask a secret's value in it (it asked for identity); the body is not sent", codings[i])
		}
		if err != nil {
			body.Close()
			return nil, fmt.Errorf("decoding the upstream's %s body to mask a secret's value in it: %w; the body is not sent", codings[i], err)
		}
	}
	return readCloser{r, body}, nil
}

// inflater reads HTTP's deflate: zlib, as the standard says, or the raw
// deflate some servers send.
func inflater(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(2)
	if err != nil {
		return nil, err
	}
	if head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// masker masks the runs in a response body as it streams, and then in its
// trailers. It holds back only an end that could begin a run, until the
// next read says whether the run goes on, so that a stream (an event of
// server-sent events) is not delayed by it. Its output is not as long as
// its input: the response has no Content-Length.
type masker struct {
	r       io.ReadCloser
	m       *matcher
	trailer http.Header // the response's, filled once the body has ended
	masked  *[]string

	in    []byte   // read, not decided yet (an end that could begin a run)
	owner []uint16 // the marks of in
	inRun bool     // the last byte decided was in a run
	out   []byte   // decided, masked, not given yet
	given int      // of out
	err   error
	done  bool
}

func newMasker(r io.ReadCloser, m *matcher, trailer http.Header, masked *[]string) *masker {
	return &masker{r: r, m: m, trailer: trailer, masked: masked}
}

func (k *masker) Read(p []byte) (int, error) {
	for k.given == len(k.out) {
		k.out, k.given = k.out[:0], 0
		if k.err != nil {
			if errors.Is(k.err, io.EOF) && !k.done {
				k.done = true
				k.m.maskHeaders(k.trailer, k.masked)
			}
			return 0, k.err
		}
		k.fill(max(len(p), 512))
	}
	n := copy(p, k.out[k.given:])
	k.given += n
	return n, nil
}

// fill reads up to size bytes more and decides what it can.
func (k *masker) fill(size int) {
	held := len(k.in)
	k.in = growTo(k.in, held+size)
	n, err := k.r.Read(k.in[held : held+size])
	k.in = k.in[:held+n]
	k.err = err
	if len(k.owner) < len(k.in) {
		k.owner = append(k.owner, make([]uint16, len(k.in)-len(k.owner))...)
	}
	owner := k.owner[:len(k.in)]
	clear(owner[held:])
	k.m.mark(k.in, owner)
	decide := len(k.in)
	if err == nil {
		decide -= k.m.pending(k.in)
	}
	k.out, k.inRun = k.m.emit(k.out, k.in[:decide], owner[:decide], k.inRun, k.masked)
	rest := copy(k.in, k.in[decide:])
	copy(owner, owner[decide:])
	k.in = k.in[:rest]
}

// growTo is b with a capacity of at least n.
func growTo(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:cap(b)]
	}
	return append(b[:cap(b)], make([]byte, n-cap(b))...)
}

func (k *masker) Close() error { return k.r.Close() }
