package decisionlog

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// followPoll is how often Follow looks for what the gateway appended.
const followPoll = 100 * time.Millisecond

// Settle bounds what Follow copies once it is stopped: it goes on until the
// log has not grown for SettleQuiet, and at most SettleMax (the gateway
// writes a connection's entry as it ends, which is as the sandbox's own
// end closes it).
const (
	SettleQuiet = 300 * time.Millisecond
	SettleMax   = 3 * time.Second
)

// Follow copies the log at path to w from its start, and what is appended
// to it as it is, until stop is closed (or ctx ends: it returns then, with
// ctx's error); then what is appended until the log settles, and returns.
// A log that is not there yet is waited for. It is how a launcher reads the
// log of a gateway that runs where it cannot open the file (a gateway Pod
// on a cluster): `propio-sandbox gateway-log` runs it there.
func Follow(ctx context.Context, path string, w io.Writer, stop <-chan struct{}) error {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	// drain copies what the log holds past what was copied; it reports
	// whether there was any.
	drain := func() (bool, error) {
		if f == nil {
			var err error
			if f, err = os.Open(path); errors.Is(err, fs.ErrNotExist) {
				return false, nil
			} else if err != nil {
				return false, fmt.Errorf("following the gateway log: %w", err)
			}
		}
		grew := false
		for {
			n, err := f.Read(buf)
			if n > 0 {
				grew = true
				if _, werr := w.Write(buf[:n]); werr != nil {
					return grew, werr
				}
			}
			if errors.Is(err, io.EOF) {
				return grew, nil
			}
			if err != nil {
				return grew, fmt.Errorf("following the gateway log: %w", err)
			}
		}
	}
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for stopped := false; !stopped; {
		if _, err := drain(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			stopped = true
		case <-tick.C:
		}
	}
	end := time.Now().Add(SettleMax)
	quiet := time.Now()
	for time.Now().Before(end) && time.Since(quiet) < SettleQuiet {
		grew, err := drain()
		if err != nil {
			return err
		}
		if grew {
			quiet = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	_, err := drain()
	return err
}

// maxLine bounds a line CopyFrom takes: an entry is far shorter.
const maxLine = 1 << 20

// CopyFrom appends to l the entries of the log lines r gives (what Follow
// copies of a gateway's log), each checked to be one Entry and written
// again as Write writes it, so that nothing but whole entries lands in the
// log. A last line without its newline is left out (the gateway was
// writing it); a line that is not an entry is left out too, and said in
// the error CopyFrom returns once r ends (it reads r to its end whatever it
// finds, so a writer to r never waits on it).
func (l *Writer) CopyFrom(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var bad int
	var firstBad, writeErr error
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) <= maxLine {
			line = append(line, chunk...)
		} else {
			line = append(line[:0], 'x') // too long: not an entry, whatever follows
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			break // io.EOF, or r's error: a partial line is dropped
		}
		if len(bytes.TrimSpace(line)) > 0 {
			var e Entry
			dec := json.NewDecoder(bytes.NewReader(line))
			dec.DisallowUnknownFields()
			if derr := dec.Decode(&e); derr != nil || dec.More() {
				bad++
				if firstBad == nil {
					firstBad = fmt.Errorf("not a decision: %.80q", line)
				}
			} else if werr := l.Write(e); werr != nil && writeErr == nil {
				writeErr = werr
			}
		}
		line = line[:0]
	}
	if writeErr != nil {
		return fmt.Errorf("copying the gateway's decisions: %w", writeErr)
	}
	if firstBad != nil {
		return fmt.Errorf("copying the gateway's decisions: %d line(s) left out, the first: %w", bad, firstBad)
	}
	return nil
}
