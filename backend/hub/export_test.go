package hub

import "time"

// SetKeepalive sets the ping interval and the write timeout until the
// returned function restores them; no console may run meanwhile.
func SetKeepalive(ping, write time.Duration) (restore func()) {
	oldPing, oldWrite := pingInterval, writeTimeout
	pingInterval, writeTimeout = ping, write
	return func() { pingInterval, writeTimeout = oldPing, oldWrite }
}

// KeepalivePeriod is how often the console pings an idle node: its
// keepalive window, and at most a tick more.
func KeepalivePeriod() time.Duration { return pingInterval + keepaliveTick(pingInterval) }

// The log budget of a node (input.go).
const (
	LogBurst = logBurst
	LogEvery = logEvery
)
