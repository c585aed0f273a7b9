package api_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// TestSessionControl: users list their sessions and sign out everywhere;
// admins list and end a user's sessions; the idle and absolute timeouts
// come from the settings; each takes effect on the next request, and every
// sign-in and sign-out is audited.
func TestSessionControl(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	u, err := f.store.CreateUser(ctx, "sam", "sam-password", "editor", sys)
	if err != nil {
		t.Fatal(err)
	}
	signIn := func() *browser {
		b := f.browser(t)
		if status, body := b.login("sam", "sam-password"); status != 200 {
			t.Fatalf("login: %d %s", status, body)
		}
		return b
	}
	type session struct {
		ID      int64 `json:"id"`
		Current bool  `json:"current"`
	}
	var list struct {
		Sessions []session `json:"sessions"`
	}
	laptop, phone := signIn(), signIn()
	_, body := laptop.do("GET", "/api/v1/me/sessions", "")
	if err := json.Unmarshal([]byte(body), &list); err != nil || len(list.Sessions) != 2 {
		t.Fatalf("my sessions: %s", body)
	}
	current := 0
	for _, s := range list.Sessions {
		if s.Current {
			current++
		}
	}
	if current != 1 {
		t.Errorf("my sessions mark %d current, want 1: %s", current, body)
	}

	// An admin ends the phone's session: the phone is out at its next
	// request, the laptop stays in.
	users := "/api/v1/users/" + strconv.FormatInt(u.ID, 10) + "/sessions"
	f.decodeJSON(t, "GET", users, "admin", "", 200, &list)
	phoneID := int64(0)
	for _, s := range list.Sessions {
		if !containsSession(laptopSessions(t, laptop), s.ID) {
			phoneID = s.ID
		}
	}
	if phoneID == 0 {
		t.Fatalf("no second session in %v", list.Sessions)
	}
	if status, body := f.call(t, "DELETE", users+"/"+strconv.FormatInt(phoneID, 10), "admin", ""); status != 200 || !strings.Contains(body, `"ended":1`) {
		t.Fatalf("revoke: %d %s", status, body)
	}
	if status, _ := phone.do("GET", "/api/v1/me", ""); status != 401 {
		t.Errorf("revoked session: %d, want 401", status)
	}
	if status, _ := laptop.do("GET", "/api/v1/me", ""); status != 200 {
		t.Errorf("other session after a revoke: %d, want 200", status)
	}
	// Sign out everywhere.
	other := signIn()
	if status, body := laptop.do("DELETE", "/api/v1/me/sessions", ""); status != 200 || !strings.Contains(body, `"ended":2`) {
		t.Fatalf("sign out everywhere: %d %s", status, body)
	}
	for name, b := range map[string]*browser{"laptop": laptop, "other": other} {
		if status, _ := b.do("GET", "/api/v1/me", ""); status != 401 {
			t.Errorf("%s after sign out everywhere: %d, want 401", name, status)
		}
	}

	// Timeouts from the settings.
	if status, body := f.call(t, "PUT", "/api/v1/settings", "admin", `{"session_idle_s":1}`); status != 400 {
		t.Errorf("idle timeout of 1 s: %d %s, want 400", status, body)
	}
	if status, body := f.call(t, "PUT", "/api/v1/settings", "admin", `{"session_idle_s":600,"session_absolute_s":3600}`); status != 200 ||
		!strings.Contains(body, `"session_idle_s":600`) || !strings.Contains(body, `"require_approval":false`) {
		t.Fatalf("settings: %d %s", status, body)
	}
	db, err := sql.Open("pgx", f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	idle, old := signIn(), signIn()
	// Ten minutes and a bit without a request, and an hour and a bit since
	// sign-in (though used a moment ago).
	if _, err := db.Exec("UPDATE sessions SET last_seen = now() - interval '601 seconds' WHERE id = (SELECT min(id) FROM sessions WHERE user_id = $1)", u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE sessions SET created_at = now() - interval '3601 seconds' WHERE id = (SELECT max(id) FROM sessions WHERE user_id = $1)", u.ID); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string]*browser{"idle": idle, "old": old} {
		if status, _ := b.do("GET", "/api/v1/me", ""); status != 401 {
			t.Errorf("%s session: %d, want 401", name, status)
		}
	}
	fresh := signIn()
	if status, _ := fresh.do("GET", "/api/v1/me", ""); status != 200 {
		t.Errorf("fresh session: %d, want 200", status)
	}

	_, body = f.call(t, "GET", "/api/v1/audit?target=user:sam&limit=100", "admin", "")
	for _, action := range []string{"auth.login", "session.revoke", "auth.logout_all"} {
		if !strings.Contains(body, `"action":"`+action+`"`) {
			t.Errorf("audit lacks %s: %s", action, excerpt(body))
		}
	}
}

func laptopSessions(t *testing.T, b *browser) []int64 {
	t.Helper()
	_, body := b.do("GET", "/api/v1/me/sessions", "")
	var list struct {
		Sessions []struct {
			ID      int64 `json:"id"`
			Current bool  `json:"current"`
		} `json:"sessions"`
	}
	json.Unmarshal([]byte(body), &list)
	var out []int64
	for _, s := range list.Sessions {
		if s.Current {
			out = append(out, s.ID)
		}
	}
	return out
}

func containsSession(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
