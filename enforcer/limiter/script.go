package limiter

import (
	_ "embed" // the Lua sources
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/rules"
)

// The limiter runs one Lua script per Take, assembled from one file per
// algorithm and the driver (take.lua). One script for every algorithm is what
// lets a single call decide keys of different algorithms all-or-nothing.
var (
	//go:embed take.lua
	takeLua string
	//go:embed token_bucket.lua
	tokenBucketLua string
)

// algorithms maps each supported algorithm to its Lua chunk, which returns
// the function take.lua calls for that algorithm's keys. Adding an algorithm
// is one .lua file, one entry here and one suffix in stateSuffix.
var algorithms = map[rules.Algorithm]string{
	rules.TokenBucket: tokenBucketLua,
}

// stateSuffix is appended to Request.Key (after its hash tag, so the slot is
// unchanged) to form the key an algorithm keeps its state under. Algorithms
// never share state: switching a limit's algorithm starts it afresh instead of
// misreading (or failing with WRONGTYPE on) another algorithm's value.
var stateSuffix = map[rules.Algorithm]string{
	rules.TokenBucket: ":tb",
}

// argsPerKey is the number of ARGV values take.lua reads per key.
const argsPerKey = 5

// valuesPerKey is the number of integers take.lua returns per key.
const valuesPerKey = 4

var takeScript = redis.NewScript(assemble())

// assemble builds the script source: a local table of algorithm functions,
// each file wrapped in a function so its locals stay its own, then the driver.
func assemble() string {
	var b strings.Builder
	b.WriteString("local algorithms = {}\n")
	// Sorted, so every node runs a byte-identical script (one SHA in the cache).
	for _, name := range slices.Sorted(maps.Keys(algorithms)) {
		fmt.Fprintf(&b, "algorithms[%q] = (function()\n%s\nend)()\n", string(name), algorithms[name])
	}
	b.WriteString(takeLua)
	return b.String()
}

// errMalformedReply marks a script reply that does not have the expected shape.
var errMalformedReply = errors.New("malformed limiter script reply")

// decode turns the script's flat integer reply (valuesPerKey per request:
// allowed, remaining, reset_after µs, retry_after µs) into decisions. It is
// the only place that interprets the reply.
func decode(reply any, reqs []Request) ([]Decision, error) {
	vals, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: got %T, want an array", errMalformedReply, reply)
	}
	if len(vals) != valuesPerKey*len(reqs) {
		return nil, fmt.Errorf("%w: got %d values, want %d", errMalformedReply, len(vals), valuesPerKey*len(reqs))
	}
	ds := make([]Decision, len(reqs))
	for i := range reqs {
		var n [valuesPerKey]int64
		for j := range n {
			v, ok := vals[i*valuesPerKey+j].(int64)
			if !ok {
				return nil, fmt.Errorf("%w: value %d is %T, want an integer", errMalformedReply, i*valuesPerKey+j, vals[i*valuesPerKey+j])
			}
			n[j] = v
		}
		if n[0] != 0 && n[0] != 1 {
			return nil, fmt.Errorf("%w: allowed flag %d", errMalformedReply, n[0])
		}
		ds[i] = Decision{
			Allowed:    n[0] == 1,
			Limit:      burst(reqs[i]),
			Remaining:  n[1],
			ResetAfter: micros(n[2]),
			RetryAfter: micros(n[3]),
		}
	}
	return ds, nil
}

// maxMicros matches MAX_US in take.lua; it keeps µs→ns conversion in range.
const maxMicros = 9_000_000_000_000_000

// micros converts a µs count from the script to a duration, clamped so a
// corrupted reply can never overflow.
func micros(us int64) time.Duration {
	return time.Duration(min(max(us, 0), maxMicros)) * time.Microsecond
}
