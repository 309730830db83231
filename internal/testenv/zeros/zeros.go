// Package zeros is the download the test servers offer: GET /bytes/N
// answers N zero bytes, at the pace ?rate=B (bytes a second) asks for, as a
// link of that speed would send them. The probe's servers and the
// benchmark's server on the host both serve it.
package zeros

import (
	"net/http"
	"strconv"
	"time"
)

// block is what a response is written from, as often as it takes.
var block = make([]byte, 256<<10)

// Serve answers r with count (the N of /bytes/N) zero bytes, or 400 when
// count is not a byte count.
func Serve(w http.ResponseWriter, r *http.Request, count string) {
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || n < 0 {
		http.Error(w, "bad byte count", http.StatusBadRequest)
		return
	}
	rate, _ := strconv.ParseInt(r.URL.Query().Get("rate"), 10, 64)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	start, sent := time.Now(), int64(0)
	for n > 0 {
		chunk := block[:min(n, int64(len(block)))]
		if _, err := w.Write(chunk); err != nil {
			return
		}
		n -= int64(len(chunk))
		sent += int64(len(chunk))
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(float64(sent) / float64(rate) * float64(time.Second)))))
		}
	}
}
