package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules"
)

// TestSignInOIDCConcurrentFirstSignIns: the same person signing in from
// several tabs at once gets one user; different people wanting one name
// get distinct ones; nobody takes over the local user of that name.
func TestSignInOIDCConcurrentFirstSignIns(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	if _, err := st.CreateUser(ctx, "sam", "password1", store.RoleAdmin, actor); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ids := make([]int64, 16)
	errs := make([]error, 16)
	for i := range ids {
		wg.Go(func() {
			// Half are one person (sub-1), the rest each someone else, all "sam".
			sub := "sub-1"
			if i%2 == 1 {
				sub = fmt.Sprintf("other-%d", i)
			}
			u, secret, csrf, err := st.SignInOIDC(ctx, store.OIDCIdentity{Issuer: "https://idp", Subject: sub, Username: "sam",
				Role: store.RoleViewer, Domains: []string{"search", "api", "api"}}, actor)
			if err == nil && (secret == "" || csrf == "") {
				err = errors.New("no session")
			}
			ids[i], errs[i] = u.ID, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("sign-in %d: %v", i, err)
		}
	}
	for i := 2; i < len(ids); i += 2 {
		if ids[i] != ids[0] {
			t.Errorf("one person got users %d and %d", ids[0], ids[i])
		}
	}
	users, err := st.ListUsers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range users {
		names = append(names, u.Username)
		if u.Username == "sam" && u.Role != store.RoleAdmin {
			t.Errorf("the local sam became %s", u.Role)
		}
	}
	if len(users) != 1+1+8 {
		t.Errorf("users = %v; want the local sam and 9 from the provider", names)
	}
	for _, want := range []string{"sam-2", "sam-10"} {
		if !slices.Contains(names, want) {
			t.Errorf("users = %v; want %s among them", names, want)
		}
	}
	role, domains, issuer, subject, err := st.UserGrants(ctx, ids[0])
	if err != nil || role != store.RoleViewer || !slices.Equal(domains, []string{"api", "search"}) || issuer != "https://idp" || subject != "sub-1" {
		t.Errorf("UserGrants = %s %v %s %s %v; want viewer [api search] https://idp sub-1", role, domains, issuer, subject, err)
	}
}

func TestSignInOIDCRefuses(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	var ie *store.InvalidError
	for _, id := range []store.OIDCIdentity{
		{Issuer: "https://idp", Role: store.RoleViewer},
		{Subject: "s", Role: store.RoleViewer},
		{Issuer: "https://idp", Subject: "s", Role: store.RoleNode},
	} {
		if _, _, _, err := st.SignInOIDC(ctx, id, actor); !errors.As(err, &ie) {
			t.Errorf("SignInOIDC(%+v) = %v; want invalid", id, err)
		}
	}
	// A long wanted name still leaves room for the suffix.
	long := strings.Repeat("n", 64)
	for range 2 {
		u, _, _, err := st.SignInOIDC(ctx, store.OIDCIdentity{Issuer: "https://idp", Subject: "s-" + time.Now().String(), Username: long, Role: store.RoleViewer}, actor)
		if err != nil || len(u.Username) > 64 {
			t.Fatalf("long name: %q %v", u.Username, err)
		}
	}
}

func TestOIDCFlowsAreSingleUse(t *testing.T) {
	t.Parallel()
	st, _ := open(t)
	ctx := context.Background()
	f := store.OIDCFlow{Nonce: "n", Verifier: "v", ReturnTo: "/x"}
	if err := st.CreateOIDCFlow(ctx, "state-1", f); err != nil {
		t.Fatal(err)
	}
	got, err := st.TakeOIDCFlow(ctx, "state-1")
	if err != nil || got != f {
		t.Fatalf("TakeOIDCFlow = %+v %v; want %+v", got, err, f)
	}
	for _, state := range []string{"state-1", "state-2"} {
		if _, err := st.TakeOIDCFlow(ctx, state); !errors.Is(err, rules.ErrNotFound) {
			t.Errorf("TakeOIDCFlow(%s) = %v; want not found", state, err)
		}
	}
}
