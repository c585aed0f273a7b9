//lint:file-ignore SA1019 nhooyr.io/websocket is the websocket library the product card fixes (its maintained twin is github.com/coder/websocket)

package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"nhooyr.io/websocket"

	"github.com/sluicehq/sluice/rules/wire"
)

// openStats opens /api/v1/stats/stream with header (a cookie or a Bearer
// token) and returns a channel that yields the close error once the
// console ends the stream.
func (f *fixture) openStats(t *testing.T, header http.Header) <-chan error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, strings.Replace(f.srv.URL, "http://", "ws://", 1)+"/api/v1/stats/stream",
		&websocket.DialOptions{HTTPHeader: header})
	if err != nil {
		t.Fatalf("dial stats stream: %v", err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	done := make(chan error, 1)
	go func() {
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// sessionHeader is the Cookie header of browser b.
func (b *browser) sessionHeader() http.Header {
	u, _ := url.Parse(b.f.srv.URL)
	var parts []string
	for _, c := range b.client.Jar.Cookies(u) {
		parts = append(parts, c.Name+"="+c.Value)
	}
	return http.Header{"Cookie": {strings.Join(parts, "; ")}}
}

// TestStatsStreamEndsOnRevocation: an open live-traffic stream ends with
// CloseRevoked once its session is signed out, its user disabled or
// demoted, or its token disabled; a stream whose credential still works
// goes on.
func TestStatsStreamEndsOnRevocation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	users := map[string]int64{}
	for _, name := range []string{"leaver", "stayer", "signout", "demoted"} {
		u, err := f.store.CreateUser(ctx, name, "password-"+name, "support", sys)
		if err != nil {
			t.Fatal(err)
		}
		users[name] = u.ID
	}
	streams := map[string]<-chan error{}
	browsers := map[string]*browser{}
	for name := range users {
		b := f.browser(t)
		if status, body := b.login(name, "password-"+name); status != 200 {
			t.Fatalf("login %s: %d %s", name, status, body)
		}
		browsers[name] = b
		streams[name] = f.openStats(t, b.sessionHeader())
	}
	f.token(t, "streamer", "viewer", nil)
	streams["token"] = f.openStats(t, http.Header{"Authorization": {"Bearer " + f.tokens["streamer"]}})

	if status, body := browsers["signout"].do("POST", "/api/v1/auth/logout", ""); status != 204 {
		t.Fatalf("logout: %d %s", status, body)
	}
	if _, err := f.store.SetUserDisabled(ctx, users["leaver"], true, sys); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.SetUserRole(ctx, users["demoted"], "viewer", sys); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.DisableToken(ctx, f.ids["token:streamer"], sys); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"signout", "leaver", "demoted", "token"} {
		select {
		case err := <-streams[name]:
			if got := websocket.CloseStatus(err); got != wire.CloseRevoked {
				t.Errorf("%s: stream closed with %v (%v), want %d", name, got, err, wire.CloseRevoked)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%s: stream still open 15 s after its credential was revoked", name)
		}
	}
	select {
	case err := <-streams["stayer"]:
		t.Errorf("stayer: stream closed (%v) though the session still works", err)
	default:
	}
}
