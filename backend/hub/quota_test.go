//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

// Quota usage end to end: real consoles, real enforcer engines and
// subscribers (in process, or a child process to SIGKILL), real Redis and
// Postgres.

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/limiter"
	enforcernode "github.com/sluicehq/sluice/enforcer/node"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/wire"
)

const quotaDomainYAML = `domain: bill
descriptors:
  - key: key
    rate_limit: {unit: month, requests_per_unit: %d, name: monthly}
    algorithm: fixed_window
    calendar: true
`

// quotaNodeEnv makes the test binary run an enforcer node (see init) that
// a test can SIGKILL: it reads "hit N VALUE" lines on stdin and answers
// "admitted K".
const quotaNodeEnv = "SLUICE_HUB_TEST_QUOTA_NODE"

func init() {
	if os.Getenv(quotaNodeEnv) != "" {
		os.Exit(runQuotaNode())
	}
}

// quotaNode builds a node's engine (node.NewEngine, as the enforcer does)
// on Redis and its subscription with quota usage sent every interval.
func quotaNode(consoleURL, token, id, redisURL, prefix string, interval time.Duration, now func() time.Time) (*engine.Engine, *subscriber.Subscriber, func(), error) {
	client, err := limiter.NewClient(redisURL, limiter.WithTimeout(2*time.Second), limiter.WithDialTimeout(2*time.Second))
	if err != nil {
		return nil, nil, nil, err
	}
	r := limiter.NewRedis(client)
	var opts []engine.Option
	if now != nil {
		r.SetClock(now)
		opts = append(opts, engine.WithQuotaClock(now))
	}
	eng := enforcernode.NewEngine(r, prefix, slog.New(slog.DiscardHandler))
	if opts != nil {
		eng = engine.New(r, prefix, opts...)
	}
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: consoleURL, NodeToken: token, NodeID: id,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		QuotaSource: eng.TakeQuota, QuotaFull: eng.QuotaFull(), QuotaInterval: interval}, eng, nil)
	if err != nil {
		client.Close()
		return nil, nil, nil, err
	}
	return eng, sub, func() { client.Close() }, nil
}

func runQuotaNode() int {
	get := os.Getenv
	interval, _ := time.ParseDuration(get("SLUICE_QUOTA_INTERVAL"))
	eng, sub, closeRedis, err := quotaNode(get("SLUICE_CONSOLE_URL"), get("SLUICE_NODE_TOKEN"), get("SLUICE_NODE_ID"),
		get("REDIS_URL"), get("SLUICE_KEY_PREFIX"), interval, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer closeRedis()
	go sub.Run(context.Background())
	for eng.Version() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var (
			n     int
			value string
		)
		if _, err := fmt.Sscanf(in.Text(), "hit %d %s", &n, &value); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		admitted := 0
		for range n {
			res, err := eng.Check(context.Background(), engine.Request{Domain: "bill",
				Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "key", Value: value}}}}})
			if err == nil && res.Code == engine.OK && res.StoreErr == nil {
				admitted++
			}
		}
		fmt.Printf("admitted %d\n", admitted)
	}
	return 0
}

// used returns the usage rows of domain bill's quota as value@period → used.
func (e *env) used(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, start := range []time.Time{nov, dec, time.Now().UTC()} {
		f := store.QuotaFilter{Domain: "bill", Rule: "monthly", Unit: rules.Month, Limit: 1000}
		f.Start, _ = rules.Month.Window(start)
		rows, err := e.st.ListQuotaUsage(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			out[r.Value+"@"+r.PeriodStart.Format("2006-01")] = r.Used
		}
	}
	return out
}

var (
	nov = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	dec = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
)

// TestQuotaMonthBoundaryInPostgres sends traffic on both sides of a
// month's end (injected Redis time) through a real node to a real
// console: the usage in Postgres per value and month equals what the
// engine admitted there.
func TestQuotaMonthBoundaryInPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	v := e.publish("bill", fmt.Sprintf(quotaDomainYAML, 5))
	var (
		mu  sync.Mutex
		now = time.Date(2026, 11, 30, 23, 59, 58, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	eng, sub, closeRedis, err := quotaNode(c.url, e.nodeToken("q1"), "q1", testenv.RedisURL(t), testenv.KeyPrefix(t), 20*time.Millisecond, clock)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "q1 on the quota version", func() bool { return eng.Version() == v })

	admitted := map[string]int64{}
	hit := func(n int, value string) {
		for range n {
			res, err := eng.Check(context.Background(), engine.Request{Domain: "bill",
				Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "key", Value: value}}}}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Code == engine.OK {
				start, _ := rules.Month.Window(clock())
				admitted[value+"@"+start.Format("2006-01")]++
			}
		}
	}
	hit(8, "alice") // 5 admitted in November
	hit(2, "bob")
	waitFor(t, "November's first usage in Postgres", func() bool { return e.used(t)["alice@2026-11"] == 5 })
	mu.Lock()
	now = time.Date(2026, 11, 30, 23, 59, 59, 999_999_000, time.UTC)
	mu.Unlock()
	hit(1, "bob")
	mu.Lock()
	now = dec.Add(2 * time.Second)
	mu.Unlock()
	hit(3, "alice")
	hit(7, "bob") // 5 admitted in December
	if admitted["alice@2026-11"] != 5 || admitted["bob@2026-11"] != 3 || admitted["alice@2026-12"] != 3 || admitted["bob@2026-12"] != 5 {
		t.Fatalf("admitted %v: not the traffic this test means", admitted)
	}
	waitFor(t, "usage in Postgres to equal the admitted counts", func() bool {
		return fmt.Sprint(e.used(t)) == fmt.Sprint(admitted)
	})

	// The API answers the same, for November's period.
	var out struct {
		Usage []struct {
			Value       string `json:"value"`
			PeriodStart string `json:"period_start"`
			PeriodEnd   string `json:"period_end"`
			Used, Limit int64
		} `json:"usage"`
	}
	e.getJSON(c.url+"/api/v1/quotas?domain=bill&rule=monthly&period=2026-11", &out)
	if len(out.Usage) != 2 || out.Usage[0].Value != "alice" || out.Usage[0].Used != 5 || out.Usage[0].Limit != 5 ||
		out.Usage[1].Value != "bob" || out.Usage[1].Used != 3 ||
		out.Usage[0].PeriodStart != "2026-11-01T00:00:00Z" || out.Usage[0].PeriodEnd != "2026-12-01T00:00:00Z" {
		t.Errorf("GET quotas for 2026-11: %+v", out.Usage)
	}
}

// TestQuotaResendCountedOnce: a batch sent again (its ack lost) is acked
// again and adds nothing; the same seq of a new epoch (a restarted node)
// is a new batch; an invalid entry is dropped and its batch acked; a batch
// invalid as a whole closes the connection.
func TestQuotaResendCountedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	e.publish("bill", fmt.Sprintf(quotaDomainYAML, 100))
	n := e.connect(c.url, wire.Hello{NodeID: "raw"})
	n.snapshot()
	batch := func(epoch string, seq, hits int64) wire.Quota {
		return wire.Quota{Type: wire.TypeQuota, Epoch: epoch, Seq: seq, Usage: []wire.QuotaUsage{
			{Domain: "bill", Rule: "monthly", Unit: "month", Value: "alice", Start: nov.Unix(), Hits: hits, Limit: 100}}}
	}
	ack := func(epoch string, seq int64) {
		t.Helper()
		msg := n.recv()
		a, ok := msg.(*wire.QuotaAck)
		if !ok || a.Epoch != epoch || a.Seq != seq {
			t.Fatalf("got %#v, want the ack of %s/%d", msg, epoch, seq)
		}
	}
	n.send(batch("e1", 1, 10))
	ack("e1", 1)
	n.send(batch("e1", 1, 10)) // the ack was lost: sent again
	ack("e1", 1)
	n.send(batch("e1", 2, 1))
	ack("e1", 2)
	n.send(batch("e1", 2, 1))
	ack("e1", 2)
	n.send(batch("e2", 1, 100)) // a new process of the node
	ack("e2", 1)
	if got := e.used(t)["alice@2026-11"]; got != 111 {
		t.Errorf("used after resends: %d, want 111", got)
	}
	// An invalid entry is dropped; the batch is still applied and
	// acknowledged, so the node does not send it again.
	bad := batch("e2", 2, 1)
	bad.Usage[0].Unit = "minute"
	n.send(bad)
	ack("e2", 2)
	if got := e.used(t)["alice@2026-11"]; got != 111 {
		t.Errorf("used after a batch of one invalid entry: %d, want 111", got)
	}
	// A batch malformed as a whole closes the connection.
	n.send(batch("e2", 0, 1))
	if err := n.closed(); err == nil || !strings.Contains(err.Error(), "seq") {
		t.Errorf("invalid batch: connection ended with %v, want a policy violation naming the seq", err)
	}
}

// TestQuotaEnforcerSIGKILL kills a real enforcer process between flushes:
// the usage it had flushed stays, what it admitted since its last flush
// is all it loses (and never more than that), and a restarted process
// counts on from there.
func TestQuotaEnforcerSIGKILL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.startConsole()
	e.publish("bill", fmt.Sprintf(quotaDomainYAML, 1_000_000))
	redisURL, prefix := testenv.RedisURL(t), testenv.KeyPrefix(t)
	type proc struct {
		cmd *exec.Cmd
		in  *os.File
		out *bufio.Scanner
	}
	start := func() *proc {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), quotaNodeEnv+"=1", "SLUICE_CONSOLE_URL="+c.url, "SLUICE_NODE_TOKEN="+e.nodeToken("killed"),
			"SLUICE_NODE_ID=killed", "REDIS_URL="+redisURL, "SLUICE_KEY_PREFIX="+prefix, "SLUICE_QUOTA_INTERVAL=300ms")
		cmd.Stderr = os.Stderr
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); w.Close() })
		p := &proc{cmd: cmd, in: w, out: bufio.NewScanner(out)}
		if !p.out.Scan() || p.out.Text() != "ready" {
			t.Fatalf("quota node did not start: %q", p.out.Text())
		}
		return p
	}
	hit := func(p *proc, n int) int64 {
		t.Helper()
		fmt.Fprintf(p.in, "hit %d alice\n", n)
		if !p.out.Scan() {
			t.Fatal("quota node died")
		}
		k, err := strconv.ParseInt(strings.TrimPrefix(p.out.Text(), "admitted "), 10, 64)
		if err != nil || k != int64(n) {
			t.Fatalf("quota node answered %q, want admitted %d", p.out.Text(), n)
		}
		return k
	}
	key := "alice@" + time.Now().UTC().Format("2006-01")

	p := start()
	flushed := hit(p, 200)
	waitFor(t, "the first 200 hits in Postgres", func() bool { return e.used(t)[key] == flushed })
	lastInterval := hit(p, 50) // not flushed yet: the interval is 300 ms
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	waitFor(t, "the console to see the node gone", func() bool { return e.nodes(c.url)["killed"].Status == "disconnected" })
	got := e.used(t)[key]
	if got < flushed || got > flushed+lastInterval {
		t.Fatalf("after SIGKILL: used %d, want between %d (flushed) and %d (admitted)", got, flushed, flushed+lastInterval)
	}
	t.Logf("SIGKILL lost %d of the %d hits admitted since the last flush", flushed+lastInterval-got, lastInterval)

	again := start()
	more := hit(again, 30)
	waitFor(t, "the restarted node's usage in Postgres", func() bool { return e.used(t)[key] == got+more })
}

// TestQuotaSurvivesConsoleKill: the console is SIGKILLed while a node has
// usage it has not had acknowledged, and more is admitted while it is
// down; when a console is back, the node's usage in Postgres is exactly
// what it admitted: a console blip loses nothing and counts nothing twice.
func TestQuotaSurvivesConsoleKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.startConsoleProcess("127.0.0.1:0")
	v := e.publish("bill", fmt.Sprintf(quotaDomainYAML, 1_000_000))
	eng, sub, closeRedis, err := quotaNode(p.url, e.nodeToken("blip"), "blip", testenv.RedisURL(t), testenv.KeyPrefix(t), 50*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "blip on the quota version", func() bool { return eng.Version() == v })

	key := "carol@" + time.Now().UTC().Format("2006-01")
	admitted := int64(0)
	hit := func(n int) {
		for range n {
			res, err := eng.Check(context.Background(), engine.Request{Domain: "bill",
				Descriptors: []engine.Descriptor{{Entries: []rules.Entry{{Key: "key", Value: "carol"}}}}})
			if err != nil || res.Code != engine.OK {
				t.Fatalf("check: %v %v", res.Code, err)
			}
			admitted++
		}
	}
	hit(100)
	waitFor(t, "the first usage in Postgres", func() bool { return e.used(t)[key] == admitted })
	hit(40) // likely in flight or pending when the console dies
	p.kill()
	hit(60) // admitted while no console answers
	e.startConsoleProcess(p.addr)
	waitFor(t, "every admitted hit in Postgres once the console is back", func() bool { return e.used(t)[key] == admitted })
	// Nothing more arrives later: counted once.
	hit(1)
	waitFor(t, "the next hit", func() bool { return e.used(t)[key] == admitted })
}
