package limiter

import "time"

// SetClock makes r decide at the times now returns instead of at Redis
// TIME (the script takes the time as an argument then). It is a test hook,
// for tests outside this package that must cross a window boundary (a
// month's end) at a time of their choosing; production never calls it.
// Call it before r's first Take.
func (r *Redis) SetClock(now func() time.Time) {
	r.now = func() int64 { return now().UnixMicro() }
}
