//lint:file-ignore SA1019 Sluice uses nhooyr.io/websocket, deprecated in favour of its maintained twin github.com/coder/websocket

package hub_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/backend"
	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// consoleHelperEnv makes the test binary run a console (see TestMain) so a
// test can SIGKILL it.
const consoleHelperEnv = "SLUICE_HUB_TEST_CONSOLE"

func TestMain(m *testing.M) {
	if os.Getenv(consoleHelperEnv) != "" {
		os.Exit(runConsoleHelper())
	}
	if addr := os.Getenv(floorEnv); addr != "" {
		os.Exit(runFloorPeers(addr))
	}
	if n, err := strconv.Atoi(os.Getenv(fleetEnv)); err == nil && n > 0 {
		os.Exit(runFleet(n, os.Getenv("SLUICE_HUB_BENCH_URL"), os.Getenv("SLUICE_HUB_BENCH_TOKENS")))
	}
	os.Exit(m.Run())
}

// runConsoleHelper serves a console on $SLUICE_LISTEN against
// $DATABASE_URL and prints "listening ADDR" once it accepts connections.
func runConsoleHelper() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := backend.Config{Listen: os.Getenv("SLUICE_LISTEN"), DatabaseURL: os.Getenv("DATABASE_URL"), AdminPassword: "helper-password", PasswordCost: bcrypt.MinCost}
	err := backend.Run(context.Background(), cfg, log, io.Discard, func(a net.Addr) { fmt.Printf("listening %s\n", a) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// env is one test database with the tokens the tests use.
type env struct {
	t        *testing.T
	dbURL    string
	st       *store.Store
	adminTok string

	mu     sync.Mutex
	tokens map[string]string // node id → its node token
}

// nodeToken returns the node token of node id, created on first use: a
// token is bound to one node id.
func (e *env) nodeToken(id string) string {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if tok, ok := e.tokens[id]; ok {
		return tok
	}
	// The name is not the id: a test may try ids Postgres would refuse.
	_, tok, err := e.st.CreateToken(context.Background(), fmt.Sprintf("node %d", len(e.tokens)), store.RoleNode, nil, store.Actor{Name: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.tokens[id] = tok
	return tok
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	dbURL := testenv.PostgresURL(t)
	st, err := store.Open(ctx, dbURL, store.PasswordCost(bcrypt.MinCost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dbURL: dbURL, st: st, tokens: map[string]string{}}
	sys := store.Actor{Name: "test"}
	if _, e.adminTok, err = st.CreateToken(ctx, "admin", store.RoleAdmin, nil, sys); err != nil {
		t.Fatal(err)
	}
	return e
}

// publish writes a new version of domain straight to the database, as any
// replica would; the replicas hear of it through NOTIFY.
func (e *env) publish(domain, yaml string) int64 {
	e.t.Helper()
	ctx := context.Background()
	base := int64(0)
	if d, err := e.st.FindDomain(ctx, domain); err == nil {
		base = d.Version
	}
	v, err := e.st.Publish(ctx, store.Change{Domain: domain, YAML: yaml, BaseVersion: base, Message: "test", Actor: store.Actor{Name: "test"}})
	if err != nil {
		e.t.Fatalf("publish %s: %v", domain, err)
	}
	return v
}

// notifyReplicas announces version v again, as a replica would after a
// publish, without publishing anything.
func (e *env) notifyReplicas(v int64) {
	e.t.Helper()
	db, err := sql.Open("pgx", e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("SELECT pg_notify($1, $2)", store.VersionsChannel, strconv.FormatInt(v, 10)); err != nil {
		e.t.Fatalf("notify: %v", err)
	}
}

func domainYAML(domain string, limit int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", domain, limit)
}

// console is a console running in this process.
type console struct {
	url  string
	stop func() // cancels Run and waits for it; also run at cleanup
}

func (e *env) startConsole() *console {
	e.t.Helper()
	return e.startConsoleLog(slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startConsoleLog is startConsole logging to log.
func (e *env) startConsoleLog(log *slog.Logger) *console {
	e.t.Helper()
	return e.startConsoleAt("127.0.0.1:0", log)
}

// startConsoleAt is startConsoleLog listening on listen.
func (e *env) startConsoleAt(listen string, log *slog.Logger) *console {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		cfg := backend.Config{Listen: listen, DatabaseURL: e.dbURL, AdminPassword: "test-password", PasswordCost: bcrypt.MinCost}
		done <- backend.Run(ctx, cfg, log, io.Discard, func(a net.Addr) { addrs <- a })
	}()
	c := &console{}
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("console: %v", err)
				}
			case <-time.After(30 * time.Second):
				e.t.Error("console did not stop within 30s")
			}
		})
	}
	e.t.Cleanup(c.stop)
	select {
	case a := <-addrs:
		c.url = "http://" + a.String()
	case err := <-done:
		e.t.Fatalf("console did not start: %v", err)
	case <-time.After(30 * time.Second):
		e.t.Fatal("console did not start within 30s")
	}
	return c
}

// process is a console running in a child process, to be killed.
type process struct {
	cmd  *exec.Cmd
	url  string
	addr string
}

// startConsoleProcess runs a console in a child process listening on addr
// ("127.0.0.1:0" for any port).
func (e *env) startConsoleProcess(addr string) *process {
	e.t.Helper()
	var p *process
	// The port of a killed console may take a moment to be free again.
	for attempt := 0; ; attempt++ {
		var err error
		p, err = e.tryConsoleProcess(addr)
		if err == nil {
			break
		}
		if attempt == 50 {
			e.t.Fatalf("console process: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Cleanup(func() { p.kill() })
	return p
}

func (e *env) tryConsoleProcess(addr string) (*process, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), consoleHelperEnv+"=1", "SLUICE_LISTEN="+addr, "DATABASE_URL="+e.dbURL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				lines <- a
			}
		}
		close(lines)
	}()
	select {
	case a, ok := <-lines:
		if !ok {
			cmd.Wait()
			return nil, errors.New("console process exited before listening")
		}
		return &process{cmd: cmd, url: "http://" + a, addr: a}, nil
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, errors.New("console process did not listen within 30s")
	}
}

// kill SIGKILLs the console: no close frames, no final registry write.
func (p *process) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}

// apiNode is a node as GET /api/v1/nodes shows it.
type apiNode struct {
	ID             string            `json:"id"`
	AppliedVersion int64             `json:"applied_version"`
	Status         string            `json:"status"`
	Labels         map[string]string `json:"labels"`
	Build          string            `json:"build"`
	Console        string            `json:"console"`
	NackVersion    *int64            `json:"nack_version"`
	NackError      string            `json:"nack_error"`
	LastSeen       time.Time         `json:"last_seen"`
	TokenID        *int64            `json:"token_id"`
	TokenName      *string           `json:"token_name"`
	Rates          *struct {
		Decisions float64 `json:"decisions_per_second"`
		Limited   float64 `json:"limited_per_second"`
	} `json:"rates"`
}

// nodes returns the registry as console c serves it, by node id.
func (e *env) nodes(baseURL string) map[string]apiNode {
	e.t.Helper()
	var body struct {
		Nodes []apiNode `json:"nodes"`
	}
	e.getJSON(baseURL+"/api/v1/nodes", &body)
	out := make(map[string]apiNode, len(body.Nodes))
	for _, n := range body.Nodes {
		out[n.ID] = n
	}
	return out
}

func (e *env) getJSON(url string, v any) {
	e.t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.adminTok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		e.t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

// waitFor polls cond until it holds, failing the test after a generous
// deadline. Nothing here asserts how fast it happens.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// node is a minimal protocol client driven by the test.
type node struct {
	t  *testing.T
	ws *websocket.Conn
	in chan any // decoded messages from the console; closed when the connection ends
	// err is why the connection ended; read it after in is closed.
	err error
}

func dialWS(ctx context.Context, baseURL, token string) (*websocket.Conn, *http.Response, error) {
	return dialWSWith(ctx, baseURL, token, nil)
}

// dialWSWith is dialWS through client (nil: http.DefaultClient).
func dialWSWith(ctx context.Context, baseURL, token string, client *http.Client) (*websocket.Conn, *http.Response, error) {
	return websocket.Dial(ctx, strings.Replace(baseURL, "http://", "ws://", 1)+"/api/v1/nodes/stream",
		&websocket.DialOptions{HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
}

// connect dials the console as a node and sends hello.
func (e *env) connect(baseURL string, hello wire.Hello) *node {
	e.t.Helper()
	n := e.connectSilent(baseURL, hello)
	go n.readLoop()
	return n
}

// connectSilent dials and sends hello but never reads.
func (e *env) connectSilent(baseURL string, hello wire.Hello) *node {
	e.t.Helper()
	return e.connectSilentWith(baseURL, e.nodeToken(hello.NodeID), hello)
}

// connectWith is connect with the node token token.
func (e *env) connectWith(baseURL, token string, hello wire.Hello) *node {
	e.t.Helper()
	n := e.connectSilentWith(baseURL, token, hello)
	go n.readLoop()
	return n
}

func (e *env) connectSilentWith(baseURL, token string, hello wire.Hello) *node {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := dialWS(ctx, baseURL, token)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	ws.SetReadLimit(wire.MaxMessageBytes)
	e.t.Cleanup(func() { ws.CloseNow() })
	hello.Type = wire.TypeHello
	if hello.Protocol == 0 {
		hello.Protocol = wire.ProtocolVersion
	}
	n := &node{t: e.t, ws: ws, in: make(chan any, 64)}
	n.send(hello)
	return n
}

func (n *node) readLoop() {
	defer close(n.in)
	for {
		_, data, err := n.ws.Read(context.Background())
		if err != nil {
			n.err = err
			return
		}
		msg, err := wire.Decode(data)
		if err != nil {
			n.err = err
			return
		}
		n.in <- msg
	}
}

func (n *node) send(v any) {
	n.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		n.t.Fatal(err)
	}
	n.sendRaw(data)
}

func (n *node) sendRaw(data []byte) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.ws.Write(ctx, websocket.MessageText, data); err != nil {
		n.t.Fatalf("node write: %v", err)
	}
}

// sendRawLenient sends data, ignoring a failure: the console may close the
// connection while it is being sent.
func (n *node) sendRawLenient(data []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n.ws.Write(ctx, websocket.MessageText, data)
}

// recv returns the next message from the console.
func (n *node) recv() any {
	n.t.Helper()
	select {
	case msg, ok := <-n.in:
		if !ok {
			n.t.Fatalf("connection closed: %v", n.err)
		}
		return msg
	case <-time.After(30 * time.Second):
		n.t.Fatal("no message from the console within 30s")
		return nil
	}
}

// snapshot returns the next message, which must be a snapshot with a valid
// checksum.
func (n *node) snapshot() *wire.Snapshot {
	n.t.Helper()
	msg := n.recv()
	snap, ok := msg.(*wire.Snapshot)
	if !ok {
		n.t.Fatalf("got %T, want a snapshot", msg)
	}
	if got := wire.Checksum(snap.Domains); got != snap.Checksum {
		n.t.Fatalf("snapshot %d checksum %s, computed %s", snap.Version, snap.Checksum, got)
	}
	return snap
}

func (n *node) ack(v int64) { n.t.Helper(); n.send(wire.Ack{Type: wire.TypeAck, Version: v}) }

// closed waits for the console to close the connection and returns the
// close error.
func (n *node) closed() error {
	n.t.Helper()
	for {
		select {
		case _, ok := <-n.in:
			if !ok {
				return n.err
			}
		case <-time.After(30 * time.Second):
			n.t.Fatal("connection still open after 30s")
			return nil
		}
	}
}
