package engine

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/enforcer/limiter"
	"github.com/sluicehq/sluice/rules"
)

func TestShardKey(t *testing.T) {
	t.Parallel()
	key := limiter.Key("p:", "api", []rules.Entry{{Key: "tenant", Value: "t1"}})
	if !strings.HasSuffix(key, "}") {
		t.Fatalf("limiter.Key %q no longer ends with its hash tag; shardKey needs updating", key)
	}
	seen := map[string]bool{key: true}
	for i := range uint64(4) {
		k := shardKey(key, i)
		if seen[k] || !strings.HasSuffix(k, "}") || strings.Count(k, "{") != 1 {
			t.Errorf("shard %d key %q: want a distinct key with the shard inside the hash tag", i, k)
		}
		seen[k] = true
	}
	// No descriptor can produce a shard key: '#' in values is escaped.
	evil := limiter.Key("p:", "api", []rules.Entry{{Key: "tenant", Value: "t1:#0"}})
	if evil == shardKey(key, 0) {
		t.Errorf("descriptor value collides with a shard key: %q", evil)
	}
}
