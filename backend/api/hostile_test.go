package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/backend/store"
	"github.com/sluicehq/sluice/rules/wire"
)

// TestPublishOverTheSnapshotBoundIs422: a publish that would
// make the snapshot larger than nodes accept gets 422 with the reason.
func TestPublishOverTheSnapshotBoundIs422(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	big := func(name string) string {
		y := domainYAML(name, 1) + "# "
		return y + strings.Repeat("x", wire.MaxSnapshotBytes/16*99/100-len(y)-1) + "\n"
	}
	for i := range 16 {
		name := fmt.Sprintf("d%02d", i)
		if _, err := f.store.Publish(context.Background(), store.Change{Domain: name, YAML: big(name), Message: "m", Actor: sys}); err != nil {
			t.Fatal(err)
		}
	}
	body := fmt.Sprintf(`{"yaml":%s,"message":"one too many","base_version":0}`, jsonString(big("d16")))
	status, got := f.call(t, "PUT", "/api/v1/domains/d16", "editor", body)
	if status != http.StatusUnprocessableEntity || !strings.Contains(got, `"code":"snapshot_too_large"`) ||
		!strings.Contains(got, "enforcer nodes accept") {
		t.Fatalf("PUT a 17th big domain = %d %s, want 422 snapshot_too_large with the reason", status, excerpt(got))
	}
	status, got = f.call(t, "POST", "/api/v1/versions/1/rollback", "editor", `{"message":"fits"}`)
	if status != http.StatusOK {
		t.Errorf("rollback to a smaller version = %d %s, want 200", status, excerpt(got))
	}
}
