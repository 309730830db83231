package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
)

// BenchmarkBrokeredDownload: 100 MB from a TLS upstream on loopback, through
// the gateway's opened TLS path, against the same download straight from
// the upstream (what a kernel-forwarded connection costs in user space:
// nothing), as MB/s.
func BenchmarkBrokeredDownload(b *testing.B) {
	up := startBrokerUpstream(b)
	for _, via := range []string{"direct", "brokered"} {
		b.Run(via, func(b *testing.B) {
			g := startBrokerGatewayOn(b, up, true)
			var c *http.Client
			if via == "direct" {
				c = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: up.roots}, DisableKeepAlives: true,
					DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
						_, port, _ := net.SplitHostPort(addr)
						return (&net.Dialer{}).DialContext(ctx, "tcp", "127.0.0.1:"+port)
					}}}
			} else {
				c = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: g.runRoots}, DisableKeepAlives: true,
					DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
						return (&net.Dialer{}).DialContext(ctx, "tcp", g.tlsAddr)
					}}}
			}
			const size = 100 << 20
			b.SetBytes(size)
			for b.Loop() {
				req, _ := http.NewRequest("GET", fmt.Sprintf("https://llm.test:%d/bytes/%d", up.port, size), nil)
				req.Header.Set("Authorization", "Bearer "+g.sentinel["LLM_TOKEN"])
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != size {
					b.Fatalf("%d bytes", n)
				}
			}
		})
	}
}
