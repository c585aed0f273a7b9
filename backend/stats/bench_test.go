package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules/wire"
)

// BenchmarkConsoleLoad runs 3 console replicas in this process, each with
// its Run loop exchanging frames through Postgres and one browser stream,
// and feeds them 100 nodes' reports of 1,000 rules each, one report per
// node per second, spread over the replicas: decoding each report from
// JSON, as the hub does, then Ingest. One op is one second of fleet
// traffic, paced in real time. It reports the process's CPU time per
// op (per second of traffic, however long the op took; all three replicas
// together, Postgres excluded), the live heap after the run, and the latency from a report's Ingest to its
// second's tick at a browser stream of another replica (p50, p99).
//
//	go test -run '^$' -bench BenchmarkConsoleLoad -benchtime 20x ./backend/stats/
func BenchmarkConsoleLoad(b *testing.B) {
	const (
		replicas = 3
		nodes    = 100
		rules    = 1000
	)
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stor := newStore(b)
	aggs := make([]*Aggregator, replicas)
	var wg sync.WaitGroup
	for i := range aggs {
		aggs[i] = New(Config{Store: stor, Replica: fmt.Sprintf("bench-%d", i)})
		if err := aggs[i].Load(ctx); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); aggs[i].Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()

	payloads := benchReports(nodes, rules)

	// A browser on the last replica: when did each second's tick arrive?
	sub := aggs[replicas-1].Subscribe("api", false)
	defer sub.Close()
	ticks := make(map[int64]time.Time)
	var tickMu sync.Mutex
	go func() {
		for m := range sub.Messages() {
			var tick struct {
				Type string `json:"type"`
				T    int64  `json:"t"`
			}
			if json.Unmarshal(m, &tick) == nil && tick.Type == "tick" {
				tickMu.Lock()
				ticks[tick.T] = time.Now()
				tickMu.Unlock()
			}
		}
	}()

	sent := make(map[int64]time.Time) // second → last report's Ingest on replica 0
	var before syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	start := time.Now()
	b.StartTimer()
	for range b.N {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		for n, p := range payloads {
			msg, err := wire.Decode(p)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			if err := aggs[n%replicas].Ingest(msg.(*wire.Stats), now); err != nil {
				b.Fatal(err)
			}
			if n%replicas == 0 {
				sent[now.Unix()] = now
			}
		}
		time.Sleep(time.Until(next))
	}
	b.StopTimer()
	var after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	time.Sleep(2 * time.Second) // the last ticks
	cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) * time.Nanosecond
	// Per second of fleet traffic (an op), whatever the pacing achieved.
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MB")

	tickMu.Lock()
	var lat []time.Duration
	for t, at := range sent {
		if got, ok := ticks[t]; ok {
			lat = append(lat, got.Sub(at))
		}
	}
	tickMu.Unlock()
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Milliseconds()), "latency-p50-ms")
		b.ReportMetric(float64(lat[(len(lat)*99)/100].Milliseconds()), "latency-p99-ms")
	}
	// Every replica sees the whole fleet.
	for _, a := range aggs {
		got, err := a.Totals(ctx, Query{Domain: "api", Rule: "rule-0000", From: start.Add(-time.Second), To: time.Now()})
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != 1 || got[0].Allowed < int64(90*nodes*(b.N-1)) {
			b.Errorf("replica %s: rule-0000 totals %+v after %d s of %d nodes", a.replica, got, b.N, nodes)
		}
	}
}

// benchReports returns one report per node: every rule of "api" allowed,
// a tenth limited, with a top value.
func benchReports(nodes, rules int) [][]byte {
	payloads := make([][]byte, nodes)
	for n := range payloads {
		rs := make([]wire.RuleStats, rules)
		for r := range rs {
			rs[r] = wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("rule-%04d", r), Allowed: 90, Limited: 10,
				TopLimited: []wire.ValueCount{{Value: fmt.Sprintf("key-%d", n%7), Count: 10}}}
		}
		payloads[n], _ = json.Marshal(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: rs})
	}
	return payloads
}

// BenchmarkConsoleLoadBaseline is the previous version's work for the
// same traffic, the baseline of BenchmarkConsoleLoad: the hub decoded each
// report and summed it into the node's rates, and nothing else.
//
//	go test -run '^$' -bench 'BenchmarkConsoleLoad(Baseline)?$' -benchtime 20x ./backend/stats/
func BenchmarkConsoleLoadBaseline(b *testing.B) {
	payloads := benchReports(100, 1000)
	var before, after syscall.Rusage
	var sum int64
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	for range b.N {
		next := time.Now().Truncate(time.Second).Add(time.Second)
		for _, p := range payloads {
			msg, err := wire.Decode(p)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range msg.(*wire.Stats).Rules {
				sum += r.Allowed + r.Limited + r.ShadowLimited + r.StoreErrors
			}
		}
		time.Sleep(time.Until(next))
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
	b.ReportMetric(float64(cpu)/1e6/float64(b.N), "cpu-ms/op")
	if sum == 0 {
		b.Fatal("nothing decoded")
	}
}
