package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Global is the store through which regions exchange their counts of
// scope: global limits (package engine's regions). Each counting window of
// each key is one hash in it, one field per region holding what that
// region admitted in the window. A node adds its region's new hits to its
// field and reads every field back in the same round trip (Sync); the
// other fields' sum is what the rest of the world admitted.
//
// It is off the request path: nodes call Sync from a background loop, so
// a slow or unreachable global store never delays a check.
type Global struct {
	client redis.UniversalClient
}

// NewGlobal returns a Global over client (standalone, Sentinel or Cluster:
// Sync pipelines single-key commands, which Cluster routes by slot).
func NewGlobal(client redis.UniversalClient) *Global { return &Global{client: client} }

// RegionCount is one key's window in a Sync: the hash Key, the hits the
// region admitted in it since the last Sync (Add, 0 for none) and how long
// the hash must live after that (TTL, at least a millisecond).
type RegionCount struct {
	Key string
	Add int64
	TTL time.Duration
}

// RegionTotals is what Sync read of one window: the sum of the other
// regions' fields (Others) and how many regions have a field (Regions,
// this one included once it has added to it).
type RegionTotals struct {
	Others  int64
	Regions int
}

// Sync adds each count's Add to region's field of its hash (setting the
// hash's TTL) and reads every hash back, in one pipelined round trip. On
// an error nothing is reported; some additions may have been applied (the
// caller adding them again then over-counts, which only under-admits).
func (g *Global) Sync(ctx context.Context, region string, counts []RegionCount) ([]RegionTotals, error) {
	if region == "" {
		return nil, errors.New("sync global counts: empty region")
	}
	if len(counts) == 0 {
		return nil, nil
	}
	pipe := g.client.Pipeline()
	reads := make([]*redis.MapStringStringCmd, len(counts))
	for i, c := range counts {
		if c.Add > 0 {
			pipe.HIncrBy(ctx, c.Key, region, c.Add)
			pipe.PExpire(ctx, c.Key, max(c.TTL, time.Millisecond))
		}
		reads[i] = pipe.HGetAll(ctx, c.Key)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("sync %d global counts: %w", len(counts), err)
	}
	out := make([]RegionTotals, len(counts))
	for i, r := range reads {
		for field, v := range r.Val() {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("sync global counts: %s field %q holds %q, not a count", counts[i].Key, field, v)
			}
			out[i].Regions++
			if field != region {
				out[i].Others += n
			}
		}
	}
	return out, nil
}

// Ping reports whether the global store answers.
func (g *Global) Ping(ctx context.Context) error { return g.client.Ping(ctx).Err() }

// Close releases the global store's connections.
func (g *Global) Close() error { return g.client.Close() }
