package checkserver_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/checkserver"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkLegitCheckUnderHeavyBodies measures a legit POST /json (one
// descriptor) while three clients send 1 MiB bodies of 20,000 descriptors
// in a loop, with the bodies scanned as they arrive ("scan", as served) and
// decoded whole first ("decode_whole", as before); the engine counts in
// process, so the figures are the HTTP path's own:
//
//	go test -run '^$' -bench LegitCheckUnderHeavyBodies -benchtime 2000x ./enforcer/checkserver/
func BenchmarkLegitCheckUnderHeavyBodies(b *testing.B) {
	d, err := rules.Parse("api.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	set, err := rules.Compile([]*rules.Domain{d})
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(limiter.NewLocal(limiter.LocalOptions{MaxKeys: 100_000}), "bench:")
	if err := eng.Apply(1, set); err != nil {
		b.Fatal(err)
	}
	srv, err := checkserver.New(eng, checkserver.Options{})
	if err != nil {
		b.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	heavy := `{"domain":"api","descriptors":[` + descriptors(20_000, 1, "u") + `]}`
	heavy = heavy[:min(len(heavy), checkserver.MaxBodyBytes-2)]
	heavy = heavy[:strings.LastIndex(heavy, "},")+1] + `]}`
	legit := `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`
	for _, c := range []struct {
		name      string
		scanAbove int
	}{{"decode_whole", 1 << 30}, {"scan", 64 << 10}} {
		b.Run(c.name, func(b *testing.B) {
			defer checkserver.SetScanAbove(c.scanAbove)()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						resp, err := http.Post(hs.URL+"/json", "application/json", strings.NewReader(heavy))
						if err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}
				})
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				resp, err := http.Post(hs.URL+"/json", "application/json", strings.NewReader(legit))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(start))
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("legit check = %d", resp.StatusCode)
				}
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			p99 := lat[min(len(lat)-1, len(lat)*99/100)]
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.Logf("%s: %d legit checks under 3 heavy clients: p50 %v, p99 %v, max %v", c.name, len(lat), lat[len(lat)/2], p99, lat[len(lat)-1])
		})
	}
}
