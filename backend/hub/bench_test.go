//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/hub"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/internal/hearing"
	"github.com/sluicehq/sluice/internal/serve"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// fleetEnv makes the test binary run a fleet of lightweight nodes (see
// runFleet) for BenchmarkPush.
const fleetEnv = "SLUICE_HUB_BENCH_FLEET"

// fleetRulesEnv is how many rules each fleet node's stats report names,
// sent every second (default 0: the nodes are idle and send nothing but
// the pongs to the console's keepalive pings, as enforcer/subscriber does).
const fleetRulesEnv = "SLUICE_HUB_BENCH_FLEET_RULES"

// fleetRules returns the rules per stats report that getenv asks for.
func fleetRules(getenv func(string) string) int {
	if r, err := strconv.Atoi(getenv(fleetRulesEnv)); err == nil && r >= 0 {
		return r
	}
	return 0
}

// runFleet connects n nodes speaking the real protocol: each decodes every
// snapshot, verifies its checksum and acks it, and while idle sends what
// enforcer/subscriber sends then: the pongs to the console's keepalive
// pings, and a ping of its own only to a console it heard nothing from for
// 40 s.
// When all n acked a version, it prints "acked VERSION UNIX_NANOS" with
// the time of the last ack. A node whose connection ends reconnects the
// way enforcer/subscriber does (exponential backoff with full jitter from
// 100 ms to 10 s, restarting after a connection that got as far as its
// hello), and every second with dial attempts the fleet prints
// "attempts UNIX_SECOND COUNT". It runs until its stdin closes.
func runFleet(n int, baseURL, tokenFile string) int {
	raiseFileLimit()
	// One node token per node: a token is bound to one node id.
	data, err := os.ReadFile(tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tokens := strings.Fields(string(data))
	if len(tokens) < n {
		fmt.Fprintf(os.Stderr, "%d node tokens for %d nodes\n", len(tokens), n)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// What the nodes report; a line "rules N" on stdin changes it.
	var report atomic.Pointer[[]byte]
	initial := fleetReport(fleetRules(os.Getenv))
	report.Store(&initial)
	type ack struct {
		version int64
		at      int64
	}
	acks := make(chan ack, n)
	var attempts sync.Map // unix second → *atomic.Int64
	attempted := func() {
		sec := time.Now().Unix()
		v, _ := attempts.LoadOrStore(sec, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	sem := make(chan struct{}, 32) // the first connections: a few at a time
	var dialing sync.WaitGroup
	var failed atomic.Bool
	for i := range n {
		sem <- struct{}{}
		if failed.Load() {
			return 1
		}
		dialing.Add(1)
		go func() {
			var ws *websocket.Conn
			var err error
			var heard atomic.Int64 // when the node last read from the console
			// A loaded machine may drop a handshake: retry a few times
			// before giving up on the fleet.
			for try := range 5 {
				attempted()
				if ws, err = dialHearing(ctx, baseURL, tokens[i], &heard); err == nil {
					break
				}
				time.Sleep(time.Duration(100<<try) * time.Millisecond)
			}
			<-sem
			dialing.Done()
			if err != nil {
				fmt.Fprintf(os.Stderr, "node %d: dial: %v\n", i, err)
				failed.Store(true)
				return
			}
			id := fmt.Sprintf("bench-%05d", i)
			var applied atomic.Int64
			ackd := func(v int64) {
				applied.Store(v)
				acks <- ack{v, time.Now().UnixNano()}
			}
			attempt := 0
			for ctx.Err() == nil {
				goingAway := false
				if ws != nil {
					ws.SetReadLimit(wire.MaxMessageBytes)
					var connected bool
					connected, goingAway = fleetNode(ctx, ws, id, applied.Load(), &report, &heard, ackd)
					if connected {
						attempt = 0
					}
				}
				// enforcer/subscriber's backoff: uniform in [0, min(10 s, 100 ms·2^attempt)],
				// or in [0, 5 s] when the console said it is going away.
				ceiling := min(10*time.Second, 100*time.Millisecond<<min(attempt, 20))
				if goingAway {
					ceiling = 5 * time.Second
				}
				attempt++
				select {
				case <-ctx.Done():
					return
				case <-time.After(rand.N(ceiling + 1)):
				}
				attempted()
				ws, err = dialHearing(ctx, baseURL, tokens[i], &heard)
				if err != nil {
					ws = nil
				}
			}
		}()
	}
	dialing.Wait()
	if failed.Load() {
		return 1
	}
	if path := os.Getenv("SLUICE_HUB_BENCH_FLEET_CPU"); path != "" {
		// The fleet's CPU profile, from the moment every node dialled.
		if f, err := os.Create(path); err == nil {
			pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var r int
			if _, err := fmt.Sscanf(sc.Text(), "rules %d", &r); err == nil {
				next := fleetReport(r)
				report.Store(&next)
			}
		}
		cancel()
	}()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for range t.C {
			now := time.Now().Unix()
			fmt.Printf("reports %d\n", reportsSent.Load())
			attempts.Range(func(k, v any) bool {
				if sec := k.(int64); sec < now {
					fmt.Printf("attempts %d %d\n", sec, v.(*atomic.Int64).Load())
					attempts.Delete(k)
				}
				return true
			})
		}
	}()
	count, first, half := map[int64]int{}, map[int64]int64{}, map[int64]int64{}
	for {
		select {
		case <-ctx.Done():
			return 0
		case a := <-acks:
			count[a.version]++
			if count[a.version] == 1 {
				first[a.version] = a.at
			}
			if count[a.version] == (n+1)/2 {
				half[a.version] = a.at
			}
			if count[a.version] == n {
				fmt.Printf("acked %d %d %d %d\n", a.version, a.at, first[a.version], half[a.version])
				delete(count, a.version)
				delete(first, a.version)
				delete(half, a.version)
			}
		}
	}
}

// fleetPingInterval is the fleet nodes' keepalive window, enforcer/subscriber's.
const fleetPingInterval = subscriber.DefaultPingInterval

// dialHearing dials the console like dialWS, noting in heard when the
// connection last read anything (the console's pings included).
func dialHearing(ctx context.Context, baseURL, token string, heard *atomic.Int64) (*websocket.Conn, error) {
	client, _ := hearing.Client(nil, func() { heard.Store(time.Now().UnixNano()) })
	ws, _, err := dialWSWith(ctx, baseURL, token, client)
	return ws, err
}

// fleetReport is every fleet node's stats report, naming rules rules of
// the benchmark's domain (k0, k1...), each with a limited value: the same
// each second, so encoded once (the nodes' CPU is not what the benchmark
// measures, and it shares the machine with the console). Nil for none.
func fleetReport(rules int) []byte {
	if rules == 0 {
		return nil
	}
	s := wire.Stats{Type: wire.TypeStats, IntervalMS: 1000}
	for i := range rules {
		top := []wire.ValueCount{{Value: fmt.Sprintf("user-%d", i), Count: 100}}
		s.Rules = append(s.Rules, wire.RuleStats{Domain: "api", Rule: fmt.Sprintf("k%d", i), Allowed: 900, Limited: 100,
			TopLimited: top, Values: top})
	}
	data, _ := json.Marshal(s)
	return data
}

// reportsSent counts the stats reports the fleet's nodes sent.
var reportsSent atomic.Int64

// fleetBuffers hold the snapshots the fleet's nodes read.
var fleetBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// fleetNode runs one connection of a node that runs version applied; it
// reports whether it got as far as sending its hello, and whether the
// console closed it as going away.
func fleetNode(ctx context.Context, ws *websocket.Conn, id string, applied int64, report *atomic.Pointer[[]byte], heard *atomic.Int64, acked func(int64)) (connected, goingAway bool) {
	defer ws.CloseNow()
	// No write deadlines: the console drops a node that stops reading,
	// and a context with a deadline per message is a timer and a cancel
	// of the fleet's CPU each.
	send := func(v any) error {
		data, _ := json.Marshal(v)
		return ws.Write(ctx, websocket.MessageText, data)
	}
	if err := send(wire.Hello{Type: wire.TypeHello, Protocol: wire.ProtocolVersion, NodeID: id, AppliedVersion: applied, Build: "bench"}); err != nil {
		return false, false
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		// An idle node decided nothing, so it reports nothing
		// (enforcer/subscriber.reportStats); it pings a console it heard
		// nothing from for its window (subscriber.keepalive).
		heard.Store(time.Now().UnixNano())
		t := time.NewTicker(fleetPingInterval / 8)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
			if time.Since(time.Unix(0, heard.Load())) < fleetPingInterval {
				continue
			}
			if err := ws.Ping(sctx); err != nil {
				return
			}
			heard.Store(time.Now().UnixNano())
		}
	}()
	go func() {
		// A busy node (SLUICE_HUB_BENCH_FLEET_RULES) reports every second.
		select {
		case <-sctx.Done():
			return
		case <-time.After(rand.N(time.Second)):
		}
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			if r := *report.Load(); r != nil && ws.Write(sctx, websocket.MessageText, r) == nil {
				reportsSent.Add(1)
			}
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	for {
		_, r, err := ws.Reader(ctx)
		if err != nil {
			return true, websocket.CloseStatus(err) == websocket.StatusGoingAway
		}
		buf := fleetBuffers.Get().(*bytes.Buffer)
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return true, websocket.CloseStatus(err) == websocket.StatusGoingAway
		}
		var snap wire.Snapshot
		err = json.Unmarshal(buf.Bytes(), &snap)
		fleetBuffers.Put(buf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "node %s: %v\n", id, err)
			return true, false
		}
		if wire.Checksum(snap.Domains) != snap.Checksum {
			fmt.Fprintf(os.Stderr, "node %s: snapshot %d: bad checksum\n", id, snap.Version)
			return true, false
		}
		if err := send(wire.Ack{Type: wire.TypeAck, Version: snap.Version}); err != nil {
			return true, false
		}
		acked(snap.Version)
	}
}

// raiseFileLimit lifts the open-file limit to its hard maximum: ten
// thousand connections need ten thousand descriptors on each side.
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil && l.Cur < l.Max {
		l.Cur = l.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

// fleet is a running fleet process.
type fleet struct {
	n     int
	rules int // per stats report
	cmd   *exec.Cmd
	stdin io.WriteCloser
	acked chan [4]int64 // version, unix nanos of its last, first and median ack

	mu       sync.Mutex
	attempts map[int64]int64 // dial attempts by unix second
	reports  int64           // stats reports sent, as last printed
}

// reportsNow returns the stats reports the fleet sent, as of its last
// count (it prints one every second).
func (f *fleet) reportsNow() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reports
}

// attemptsBetween returns the dial attempts in the whole seconds from
// from to to, and the most in one second.
func (f *fleet) attemptsBetween(from, to time.Time) (total, peak int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sec, n := range f.attempts {
		if sec >= from.Unix() && sec <= to.Unix() {
			total += n
			peak = max(peak, n)
		}
	}
	return total, peak
}

func startFleet(b *testing.B, n, rules int, baseURL, tokenFile string) *fleet {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	// GOGC=400: the fleet is the load generator, and its collections
	// would take CPU from the console it measures; its memory is not
	// measured. (With no collections at all it is slower: a heap that
	// only grows takes page faults for fresh memory.)
	cmd.Env = append(os.Environ(), "GOGC=400", fleetEnv+"="+strconv.Itoa(n), "SLUICE_HUB_BENCH_URL="+baseURL, "SLUICE_HUB_BENCH_TOKENS="+tokenFile,
		fleetRulesEnv+"="+strconv.Itoa(rules))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	f := &fleet{n: n, rules: rules, cmd: cmd, stdin: stdin, acked: make(chan [4]int64, 16), attempts: map[int64]int64{}}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var v, at, first, half int64
			if _, err := fmt.Sscanf(sc.Text(), "acked %d %d %d %d", &v, &at, &first, &half); err == nil {
				f.acked <- [4]int64{v, at, first, half}
			} else if _, err := fmt.Sscanf(sc.Text(), "reports %d", &v); err == nil {
				f.mu.Lock()
				f.reports = v
				f.mu.Unlock()
			} else if _, err := fmt.Sscanf(sc.Text(), "attempts %d %d", &v, &at); err == nil {
				f.mu.Lock()
				f.attempts[v] += at
				f.mu.Unlock()
			}
		}
		close(f.acked)
	}()
	return f
}

// wait returns when every node acked version v, and the time of the last
// ack.
func (f *fleet) wait(b *testing.B, v int64) time.Time {
	b.Helper()
	last, _, _ := f.waitAll(b, v)
	return last
}

// waitAll returns when every node acked version v, and the times of the
// last, the first and the median ack.
func (f *fleet) waitAll(b *testing.B, v int64) (last, first, median time.Time) {
	b.Helper()
	// Generous: a fleet's first connections on a loaded machine take
	// minutes (each node's first hello binds its token, a commit).
	timeout := time.After(20 * time.Minute)
	for {
		select {
		case a, ok := <-f.acked:
			if !ok {
				b.Fatal("fleet exited")
			}
			if a[0] == v {
				return time.Unix(0, a[1]), time.Unix(0, a[2]), time.Unix(0, a[3])
			}
		case <-timeout:
			b.Fatalf("%d nodes did not all ack version %d within 20 minutes", f.n, v)
		}
	}
}

// cpu returns the share of one CPU this process and the fleet's used over
// the next d.
func (f *fleet) cpu(b *testing.B, d time.Duration) (console, fleet, postgres float64) {
	b.Helper()
	c0, f0, p0 := testenv.ProcessCPU(os.Getpid()), testenv.ProcessCPU(f.cmd.Process.Pid), testenv.PostgresCPU()
	time.Sleep(d)
	c1, f1, p1 := testenv.ProcessCPU(os.Getpid()), testenv.ProcessCPU(f.cmd.Process.Pid), testenv.PostgresCPU()
	return float64(c1-c0) / float64(d), float64(f1-f0) / float64(d), float64(p1-p0) / float64(d)
}

// machineCPU returns the clock ticks all CPUs spent busy and in all
// since boot, from /proc/stat; 0 where it is not there.
func machineCPU() (busy, all int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		all += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, all
}

// setRules makes the fleet's nodes report rules rules from their next
// report on.
func (f *fleet) setRules(b *testing.B, rules int) {
	b.Helper()
	if _, err := fmt.Fprintf(f.stdin, "rules %d\n", rules); err != nil {
		b.Fatal(err)
	}
	f.rules = rules
}

func (f *fleet) stop() {
	f.stdin.Close()
	f.cmd.Wait()
}

// heapAndStacks is the memory this process holds after collections (a
// few: each may shrink goroutine stacks by half), and the part of it in
// goroutine stacks.
func heapAndStacks() (total, stacks uint64) {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse, m.StackInuse
}

// fleetSizes are BenchmarkPush's fleets.
var fleetSizes = []int{1, 10, 100, 1000, 10000}

// BenchmarkPush measures rule push from one console to 1 (the baseline),
// 10, 100, 1,000 and 10,000 lightweight nodes in a child process: per
// publish, the time from the commit of the version to the last node's ack,
// with the version travelling the multi-replica way (the publish commits in
// this process, the console learns of it by LISTEN/NOTIFY). Each node
// verifies the snapshot's checksum before acking and, idle, sends nothing
// but a keepalive ping every 30 s, as enforcer/subscriber does; the idle
// window measures what such a fleet costs. It reports p50, p99 and max over the b.N publishes (use
// -benchtime=NNx), and the console's heap and stack memory per connected
// node (the nodes live in the child process, so this process holds only
// the console, and the benchmark's own store).
//
// restart/nodes=N restarts the console under a connected fleet b.N times
// (graceful shutdown, a version published while it is down, a new console
// on the same address) and reports the time from the shutdown to the last
// node's ack of that version, the time the console was down, and the dial
// attempts reaching its address: the most in one second, and the total per
// node.
//
// busy/nodes=N has every node of 1,000 or 10,000 report 100 rules of
// traffic (each with a limited value) every second, and reports the console's CPU per report
// and the cores that 100,000 such nodes keep busy.
//
// SLUICE_HUB_BENCH_FLEET_RULES sets the rules per report of the other
// fleets (default 1; 0: the nodes send no stats).
func BenchmarkPush(b *testing.B) {
	raiseFileLimit()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dbURL := testenv.PostgresURL(b)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	// Node i of a fleet uses line i of tokenFile.
	tokens := make([]string, slices.Max(fleetSizes))
	var g errgroup.Group
	g.SetLimit(4)
	for i := range tokens {
		g.Go(func() error {
			_, token, err := st.CreateToken(ctx, fmt.Sprintf("bench-%05d", i), store.RoleNode, nil, store.Actor{Name: "bench"})
			tokens[i] = token
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	tokenFile := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(tokens, "\n")), 0o600); err != nil {
		b.Fatal(err)
	}
	// startConsole runs a console on listen and returns its URL and a
	// function that shuts it down gracefully and waits for it.
	startConsole := func(listen string) (string, func()) {
		cctx, ccancel := context.WithCancel(ctx)
		addrs, done := make(chan net.Addr, 1), make(chan error, 1)
		go func() {
			// Room for the whole fleet: the default connection cap
			// (serve.DefaultMaxConns) is below the largest one.
			cfg := backend.Config{Listen: listen, DatabaseURL: dbURL, AdminPassword: "bench-password",
				Limits: serve.Limits{MaxConns: 2 * slices.Max(fleetSizes)}}
			done <- backend.Run(cctx, cfg, slog.New(slog.DiscardHandler), io.Discard, func(a net.Addr) { addrs <- a })
		}()
		select {
		case a := <-addrs:
			return "http://" + a.String(), func() { ccancel(); <-done }
		case err := <-done:
			ccancel()
			b.Fatal(err)
			return "", nil
		}
	}
	baseURL, stopConsole := startConsole("127.0.0.1:0")
	b.Cleanup(func() { stopConsole() })

	version := int64(0)
	// rules is how many rules the published domain holds.
	rules := 40
	// publish returns the new version and when the publish began: the
	// commit is a few queries later, so the latencies measured from there
	// are upper bounds. (The time Publish returns is too late: nodes can
	// ack before the commit's reply reaches the publisher.)
	publish := func() (int64, time.Time) {
		version++
		start := time.Now()
		// A realistic ruleset: a few domains of a few dozen rules each.
		var y strings.Builder
		fmt.Fprintf(&y, "domain: api\ndescriptors:\n")
		for i := range rules {
			fmt.Fprintf(&y, "  - key: k%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, 100+int(version))
		}
		v, err := st.Publish(ctx, store.Change{Domain: "api", YAML: y.String(), BaseVersion: version - 1,
			Message: "bench", Actor: store.Actor{Name: "bench"}})
		if err != nil {
			b.Fatal(err)
		}
		return v, start
	}
	publish()
	base, baseStacks := heapAndStacks()
	baseGoroutines := runtime.NumGoroutine()

	var current *fleet
	// What each nodes=N run measured of its publishes, for floor-nodes=N.
	type pushRun struct {
		cpu   time.Duration // console CPU per publish
		bytes int           // bytes written per node per publish
	}
	publishCPU := map[int]pushRun{}
	b.Cleanup(func() {
		if current != nil {
			current.stop()
		}
	})
	// The fleets' stats reports: SLUICE_HUB_BENCH_FLEET_RULES rules each
	// (see fleetRules), but for busy/.
	reportRules := fleetRules(os.Getenv)
	useFleet := func(b *testing.B, n, rules int) {
		// The fleet outlives the probing run with b.N = 1.
		if current != nil && current.n == n && current.rules != rules {
			current.setRules(b, rules) // the same nodes, reporting more
		}
		if current == nil || current.n != n {
			if current != nil {
				current.stop()
			}
			current = startFleet(b, n, rules, baseURL, tokenFile)
			current.wait(b, version) // each node got the latest on connect
		}
	}
	for _, n := range fleetSizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			useFleet(b, n, reportRules)
			held, stacks := heapAndStacks()
			perNode := float64(held-min(base, held)) / float64(n)
			stackPerNode := float64(stacks-min(baseStacks, stacks)) / float64(n)
			goroutines := float64(runtime.NumGoroutine()-baseGoroutines) / float64(n)
			if path := os.Getenv("SLUICE_HUB_BENCH_HEAP"); path != "" {
				// A heap profile with the fleet connected (-memprofile is
				// written after it left).
				if f, err := os.Create(fmt.Sprintf("%s.%d", path, n)); err == nil {
					pprof.WriteHeapProfile(f)
					f.Close()
				}
			}

			lat := make([]time.Duration, 0, b.N)
			var firsts, medians []time.Duration
			// The console's CPU profiles: PATH.idle.N over the idle
			// window, PATH.N over the publishes.
			path := os.Getenv("SLUICE_HUB_BENCH_CPU")
			profile := func(name string) func() {
				if b.N == 1 {
					return func() {}
				}
				f, err := os.Create(name)
				if err != nil {
					return func() {}
				}
				pprof.StartCPUProfile(f)
				return func() { pprof.StopCPUProfile(); f.Close() }
			}
			stop := func() {}
			if path != "" {
				stop = profile(fmt.Sprintf("%s.idle.%d", path, n))
			}
			// Both processes' CPU while the fleet is connected and idle
			// (keepalive pings, registry heartbeats) over one period of
			// the console's keepalive, so every node is pinged in it
			// once (the fleet acked the last publish together, so its
			// pings come in one burst), then over the publishes.
			idleConsole, idleFleet, idlePostgres := current.cpu(b, hub.KeepalivePeriod())
			stop()
			if path != "" {
				defer profile(fmt.Sprintf("%s.%d", path, n))()
			}
			c0, f0, p0 := testenv.ProcessCPU(os.Getpid()), testenv.ProcessCPU(current.cmd.Process.Pid), testenv.PostgresCPU()
			busy0, all0 := machineCPU()
			w0, _ := testenv.WriteCalls()
			wb0, _ := testenv.WrittenBytes()
			b.ResetTimer()
			for range b.N {
				v, began := publish()
				last, first, median := current.waitAll(b, v)
				lat = append(lat, last.Sub(began))
				firsts, medians = append(firsts, first.Sub(began)), append(medians, median.Sub(began))
			}
			b.StopTimer()
			b.Logf("%d nodes, publish to last ack: %v", n, lat)
			c1, f1, p1 := testenv.ProcessCPU(os.Getpid()), testenv.ProcessCPU(current.cmd.Process.Pid), testenv.PostgresCPU()
			busy1, all1 := machineCPU()
			w1, _ := testenv.WriteCalls()
			wb1, _ := testenv.WrittenBytes()
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(w1-w0)/float64(b.N*n), "console-writes/node/publish")
			bytesPerNode := int((wb1 - wb0) / int64(b.N*n))
			b.ReportMetric(float64(bytesPerNode), "console-bytes/node/publish")
			publishCPU[n] = pushRun{cpu: (c1 - c0) / time.Duration(b.N), bytes: bytesPerNode}
			if all1 > all0 {
				b.ReportMetric(100*float64(busy1-busy0)/float64(all1-all0), "machine-busy-%")
			}
			b.ReportMetric(quantile(lat, 0.50), "p50-ms")
			b.ReportMetric(quantile(lat, 0.99), "p99-ms")
			b.ReportMetric(quantile(lat, 1), "max-ms")
			b.ReportMetric(quantile(firsts, 0.5), "first-ack-p50-ms")
			b.ReportMetric(quantile(medians, 0.5), "median-ack-p50-ms")
			b.ReportMetric(perNode/1024, "KiB/node")
			b.ReportMetric(stackPerNode/1024, "stack-KiB/node")
			b.ReportMetric(goroutines, "goroutines/node")
			b.ReportMetric(100*idleConsole, "idle-console-cpu-%")
			b.ReportMetric(1e6*idleConsole/float64(n), "idle-console-cpu-us/node/s")
			b.ReportMetric(100*idleFleet, "idle-fleet-cpu-%")
			b.ReportMetric(100*idlePostgres, "idle-postgres-cpu-%")
			b.ReportMetric(float64((p1-p0).Milliseconds())/float64(b.N), "postgres-cpu-ms/publish")
			b.ReportMetric(float64((c1-c0).Milliseconds())/float64(b.N), "console-cpu-ms/publish")
			b.ReportMetric(float64((f1-f0).Milliseconds())/float64(b.N), "fleet-cpu-ms/publish")
		})
	}
	for _, n := range fleetSizes {
		b.Run(fmt.Sprintf("floor-nodes=%d", n), func(b *testing.B) {
			// The transport floor of the publishes nodes=n measured: the
			// same bytes to as many sockets, an ack read from each, and
			// nothing else. The fleet is gone meanwhile: its idle
			// keepalives would be counted.
			run, ok := publishCPU[n]
			if !ok {
				b.Skipf("nodes=%d did not run: the floor sends the snapshot size it measured", n)
			}
			if current != nil {
				current.stop()
				current = nil
				time.Sleep(3 * time.Second) // the console marks the fleet gone
			}
			b.ResetTimer()
			floor := floorPublish(b, n, run.bytes, max(5, b.N))
			b.StopTimer()
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(floor.Microseconds())/1000, "floor-cpu-ms/publish")
			b.ReportMetric(float64(floor.Microseconds())/float64(n), "floor-cpu-us/node")
			b.ReportMetric(float64(run.cpu)/float64(floor), "console-x-floor")
		})
	}
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("restart/nodes=%d", n), func(b *testing.B) {
			useFleet(b, n, reportRules)
			listen := strings.TrimPrefix(baseURL, "http://")
			var acked, down []time.Duration
			var peak, total int64
			b.ResetTimer()
			for range b.N {
				began := time.Now()
				stopConsole()
				v, _ := publish() // while the console is down
				_, stopConsole = startConsole(listen)
				up := time.Now()
				last := current.wait(b, v)
				acked, down = append(acked, last.Sub(began)), append(down, up.Sub(began))
				time.Sleep(1100 * time.Millisecond) // the fleet prints a second's attempts after it ends
				t, p := current.attemptsBetween(began, last)
				total, peak = total+t, max(peak, p)
			}
			b.StopTimer()
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(quantile(acked, 0.5)/1000, "all-acked-s")
			b.ReportMetric(quantile(down, 0.5)/1000, "down-s")
			b.ReportMetric(float64(peak), "peak-dials/s")
			b.ReportMetric(float64(total)/float64(n*b.N), "dials/node")
		})
	}
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("busy/nodes=%d", n), func(b *testing.B) {
			// Every node reports busyRules rules of a version that has them:
			// each row counts (none is dropped as unknown).
			const busyRules = 100
			rules = busyRules
			defer func() { rules = 40 }()
			publish()
			useFleet(b, n, busyRules)
			time.Sleep(2 * time.Second) // every node's ticker runs
			var console, postgres time.Duration
			var reports int64
			var elapsed time.Duration
			b.ResetTimer()
			for range b.N {
				// One op: 5 s of the fleet's reports, counted by the fleet
				// (it prints its count every second, so windows of whole
				// seconds between two prints).
				r0 := current.reportsNow()
				for current.reportsNow() == r0 {
					time.Sleep(10 * time.Millisecond)
				}
				start, r0 := time.Now(), current.reportsNow()
				c0, p0 := testenv.ProcessCPU(os.Getpid()), testenv.PostgresCPU()
				for current.reportsNow() == r0 || time.Since(start) < 4500*time.Millisecond {
					time.Sleep(10 * time.Millisecond)
				}
				c1, p1, r1 := testenv.ProcessCPU(os.Getpid()), testenv.PostgresCPU(), current.reportsNow()
				elapsed += time.Since(start)
				console, postgres, reports = console+c1-c0, postgres+p1-p0, reports+r1-r0
			}
			b.StopTimer()
			perReport := float64(console.Microseconds()) / float64(reports)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(reports)/elapsed.Seconds(), "reports/s")
			b.ReportMetric(perReport, "console-cpu-us/report")
			b.ReportMetric(100*float64(console)/float64(elapsed), "console-cpu-%")
			b.ReportMetric(100*float64(postgres)/float64(elapsed), "postgres-cpu-%")
			// 100,000 nodes reporting once a second keep this many cores of
			// console CPU busy.
			b.ReportMetric(perReport*100000/1e6, "console-cores/100k-nodes")
		})
	}
}

// quantile returns the p quantile of d in milliseconds; it sorts d.
func quantile(d []time.Duration, p float64) float64 {
	slices.Sort(d)
	i := int(float64(len(d))*p+0.5) - 1
	return float64(d[max(0, min(i, len(d)-1))].Microseconds()) / 1000
}
