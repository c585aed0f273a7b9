package middleware

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/rules"
)

// Source is where a descriptor entry's value comes from in an HTTP request.
type Source string

// Sources of RequestEntry.
const (
	// FromHeader takes the value of the request header Name (the first
	// line, as sent).
	FromHeader Source = "header"
	// FromRemoteAddress takes the client's IP address: the TCP peer, or,
	// when the peer is a trusted proxy, the address it forwarded in
	// X-Forwarded-For (see ClientIP).
	FromRemoteAddress Source = "remote_address"
	// FromPath takes the URL path.
	FromPath Source = "path"
	// FromMethod takes the request method.
	FromMethod Source = "method"
	// FromQuery takes the first value of the query parameter Name.
	FromQuery Source = "query"
	// FromValue takes the fixed Value (e.g. a global limit's "all").
	FromValue Source = "value"
)

// RequestEntry builds one descriptor entry: Key, and the value from Source.
type RequestEntry struct {
	Key    string
	Source Source
	// Name is the header or query parameter name for FromHeader and
	// FromQuery.
	Name string
	// Value is the fixed value for FromValue.
	Value string
}

// RequestDescriptor builds one descriptor of a check from a request. As in
// Envoy, a descriptor one of whose values is missing (an absent header or
// query parameter) is not sent at all.
type RequestDescriptor struct {
	Entries []RequestEntry
}

// DefaultDescriptors limits by client address alone: one descriptor
// [{remote_address: <client IP>}].
var DefaultDescriptors = []RequestDescriptor{{Entries: []RequestEntry{{Key: "remote_address", Source: FromRemoteAddress}}}}

// Validate reports the first problem of specs: an entry without a key, an
// unknown source, a header or query entry without a name.
func Validate(specs []RequestDescriptor) error {
	for i, d := range specs {
		if len(d.Entries) == 0 {
			return fmt.Errorf("request_descriptors[%d]: no entries", i)
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: key is empty", i, j)
			case (e.Source == FromHeader || e.Source == FromQuery) && e.Name == "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: %s needs a name", i, j, e.Source)
			}
			switch e.Source {
			case FromHeader, FromRemoteAddress, FromPath, FromMethod, FromQuery, FromValue:
			default:
				return fmt.Errorf("request_descriptors[%d].entries[%d]: unknown source %q", i, j, e.Source)
			}
		}
	}
	return nil
}

// Build returns the descriptors specs build from r; trusted lists the
// proxies whose X-Forwarded-For is believed (see ClientIP).
func Build(r *http.Request, specs []RequestDescriptor, trusted []netip.Prefix) []engine.Descriptor {
	out := make([]engine.Descriptor, 0, len(specs))
	var (
		query  url.Values
		client string
	)
next:
	for _, d := range specs {
		entries := make([]rules.Entry, len(d.Entries))
		for j, e := range d.Entries {
			var v string
			switch e.Source {
			case FromHeader:
				v = r.Header.Get(e.Name)
			case FromRemoteAddress:
				if client == "" {
					if ip := ClientIP(r, trusted); ip.IsValid() {
						client = ip.String()
					}
				}
				v = client
			case FromPath:
				v = r.URL.Path
			case FromMethod:
				v = r.Method
			case FromQuery:
				if query == nil {
					query = r.URL.Query()
				}
				v = query.Get(e.Name)
			case FromValue:
				v = e.Value
			}
			if v == "" {
				continue next
			}
			entries[j] = rules.Entry{Key: e.Key, Value: v}
		}
		out = append(out, engine.Descriptor{Entries: entries})
	}
	return out
}

// ClientIP returns the address of the client that sent r. It is the TCP
// peer (r.RemoteAddr) unless the peer is in trusted: then X-Forwarded-For
// is read from the right, skipping trusted proxies, and the first address
// not in trusted is the client (addresses further left were written by the
// client itself and prove nothing). If every hop is trusted the leftmost is
// returned; a malformed hop ends the walk at the last good one. IPv4-mapped
// IPv6 addresses are unmapped. The zero Addr means r.RemoteAddr is not an
// IP address (e.g. a unix socket).
func ClientIP(r *http.Request, trusted []netip.Prefix) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	var ip netip.Addr
	if err == nil {
		ip = peer.Addr().Unmap()
	} else if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		ip = a.Unmap()
	}
	if !ip.IsValid() || !isTrusted(ip, trusted) {
		return ip
	}
	lines := r.Header.Values("X-Forwarded-For")
	for i := len(lines) - 1; i >= 0; i-- {
		hops := lines[i]
		for hops != "" {
			var hop string
			if k := strings.LastIndexByte(hops, ','); k >= 0 {
				hop, hops = hops[k+1:], hops[:k]
			} else {
				hop, hops = hops, ""
			}
			a, err := netip.ParseAddr(strings.TrimSpace(hop))
			if err != nil {
				return ip
			}
			ip = a.Unmap()
			if !isTrusted(ip, trusted) {
				return ip
			}
		}
	}
	return ip
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies parses a comma-separated list of CIDR prefixes or
// single addresses ("10.0.0.0/8, 127.0.0.1, ::1").
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if strings.Contains(part, "/") {
			p, err := netip.ParsePrefix(part)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q: %w", part, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %w", part, err)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}
