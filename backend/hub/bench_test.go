//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

package hub_test

import (
	"bufio"
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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// fleetEnv makes the test binary run a fleet of lightweight nodes (see
// runFleet) for BenchmarkPush.
const fleetEnv = "SLUICE_HUB_BENCH_FLEET"

// runFleet connects n nodes speaking the real protocol: each decodes every
// snapshot, verifies its checksum, acks it and sends stats every second.
// When all n acked a version, it prints "acked VERSION UNIX_NANOS" with
// the time of the last ack. It runs until its stdin closes.
func runFleet(n int, baseURL, tokenFile string) int {
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
	type ack struct {
		version int64
		at      int64
	}
	acks := make(chan ack, n)
	failed := make(chan error, n)
	sem := make(chan struct{}, 32) // connect a few at a time
	for i := range n {
		sem <- struct{}{}
		ws, _, err := dialWS(ctx, baseURL, tokens[i])
		<-sem
		if err != nil {
			fmt.Fprintf(os.Stderr, "node %d: dial: %v\n", i, err)
			return 1
		}
		ws.SetReadLimit(wire.MaxMessageBytes)
		go func() {
			if err := fleetNode(ctx, ws, fmt.Sprintf("bench-%04d", i), func(v int64) {
				acks <- ack{v, time.Now().UnixNano()}
			}); err != nil && ctx.Err() == nil {
				failed <- fmt.Errorf("node %d: %w", i, err)
			}
		}()
	}
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	count := map[int64]int{}
	for {
		select {
		case <-ctx.Done():
			return 0
		case err := <-failed:
			fmt.Fprintln(os.Stderr, err)
			return 1
		case a := <-acks:
			count[a.version]++
			if count[a.version] == n {
				fmt.Printf("acked %d %d\n", a.version, a.at)
				delete(count, a.version)
			}
		}
	}
}

func fleetNode(ctx context.Context, ws *websocket.Conn, id string, acked func(int64)) error {
	defer ws.CloseNow()
	send := func(v any) error {
		data, _ := json.Marshal(v)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return ws.Write(wctx, websocket.MessageText, data)
	}
	if err := send(wire.Hello{Type: wire.TypeHello, Protocol: wire.ProtocolVersion, NodeID: id, Build: "bench"}); err != nil {
		return err
	}
	go func() {
		time.Sleep(rand.N(time.Second))
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				send(wire.Stats{Type: wire.TypeStats, IntervalMS: 1000, Rules: []wire.RuleStats{{Domain: "api", Rule: "per-key", Allowed: 900, Limited: 100}}})
			}
		}
	}()
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		var snap wire.Snapshot
		if err := json.Unmarshal(data, &snap); err != nil {
			return err
		}
		if wire.Checksum(snap.Domains) != snap.Checksum {
			return fmt.Errorf("snapshot %d: bad checksum", snap.Version)
		}
		if err := send(wire.Ack{Type: wire.TypeAck, Version: snap.Version}); err != nil {
			return err
		}
		acked(snap.Version)
	}
}

// fleet is a running fleet process.
type fleet struct {
	n     int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	acked chan [2]int64 // version, unix nanos of its last ack
}

func startFleet(b *testing.B, n int, baseURL, tokenFile string) *fleet {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), fleetEnv+"="+strconv.Itoa(n), "SLUICE_HUB_BENCH_URL="+baseURL, "SLUICE_HUB_BENCH_TOKENS="+tokenFile)
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
	f := &fleet{n: n, cmd: cmd, stdin: stdin, acked: make(chan [2]int64, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var v, at int64
			if _, err := fmt.Sscanf(sc.Text(), "acked %d %d", &v, &at); err == nil {
				f.acked <- [2]int64{v, at}
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
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case a, ok := <-f.acked:
			if !ok {
				b.Fatal("fleet exited")
			}
			if a[0] == v {
				return time.Unix(0, a[1])
			}
		case <-timeout:
			b.Fatalf("%d nodes did not all ack version %d within 2 minutes", f.n, v)
		}
	}
}

func (f *fleet) stop() {
	f.stdin.Close()
	f.cmd.Wait()
}

// heapAndStacks is the memory this process holds after a collection.
func heapAndStacks() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// BenchmarkPush measures rule push from one console to 1 (the baseline),
// 10, 100 and 1,000 lightweight nodes in a child process: per publish, the time from the
// commit of the version to the last node's ack, with the version travelling
// the multi-replica way (the publish commits in this process, the console
// learns of it by LISTEN/NOTIFY). Each node verifies the snapshot's
// checksum before acking and sends stats every second. It reports p50, p99
// and max over the b.N publishes (use -benchtime=NNx), and the console's
// heap and stack memory per connected node.
func BenchmarkPush(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	dbURL := testenv.PostgresURL(b)
	st, err := store.Open(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	// Node i of a fleet uses line i of tokenFile.
	var tokens strings.Builder
	for i := range 1000 {
		_, token, err := st.CreateToken(ctx, fmt.Sprintf("bench-%04d", i), store.RoleNode, nil, store.Actor{Name: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintln(&tokens, token)
	}
	tokenFile := filepath.Join(b.TempDir(), "tokens")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	addrs, done := make(chan net.Addr, 1), make(chan error, 1)
	go func() {
		cfg := backend.Config{Listen: "127.0.0.1:0", DatabaseURL: dbURL, AdminPassword: "bench-password"}
		done <- backend.Run(ctx, cfg, slog.New(slog.DiscardHandler), io.Discard, func(a net.Addr) { addrs <- a })
	}()
	var baseURL string
	select {
	case a := <-addrs:
		baseURL = "http://" + a.String()
	case err := <-done:
		b.Fatal(err)
	}
	b.Cleanup(func() { cancel(); <-done })

	version := int64(0)
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
		for i := range 40 {
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
	base := heapAndStacks()

	var current *fleet
	b.Cleanup(func() {
		if current != nil {
			current.stop()
		}
	})
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			// The fleet outlives the probing run with b.N = 1.
			if current == nil || current.n != n {
				if current != nil {
					current.stop()
				}
				current = startFleet(b, n, baseURL, tokenFile)
				current.wait(b, version) // each node got the latest on connect
			}
			held := heapAndStacks()
			perNode := float64(held-min(base, held)) / float64(n)

			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				v, began := publish()
				lat = append(lat, current.wait(b, v).Sub(began))
			}
			b.StopTimer()
			slices.Sort(lat)
			q := func(p float64) float64 {
				i := int(float64(len(lat))*p+0.5) - 1
				return float64(lat[max(0, min(i, len(lat)-1))].Microseconds()) / 1000
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(q(0.50), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1), "max-ms")
			b.ReportMetric(perNode/1024, "KiB/node")
		})
	}
}
