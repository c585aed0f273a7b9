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

// DefaultDescriptors limits by client address alone: one descriptor
// [{remote_address: <client IP>}]. A Limiter uses it when neither its
// Config nor the domain's request_descriptors say otherwise.
var DefaultDescriptors = []rules.RequestDescriptor{{Entries: []rules.RequestEntry{{Key: "remote_address", From: rules.FromRemoteAddress}}}}

// Validate reports the first problem of specs built in code (the rules
// parser checks the request_descriptors of a domain): a descriptor without
// entries, an entry without a key, with both or neither of a source and a
// fixed value, with an unknown source, or a header or query entry without
// a name.
func Validate(specs []rules.RequestDescriptor) error {
	for i, d := range specs {
		if len(d.Entries) == 0 {
			return fmt.Errorf("request_descriptors[%d]: no entries", i)
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: key is empty", i, j)
			case e.From == "" && e.Value == "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: needs a source (from) or a fixed value", i, j)
			case e.From != "" && e.Value != "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: has both a source and a fixed value", i, j)
			case (e.From == rules.FromHeader || e.From == rules.FromQuery) && e.Name == "":
				return fmt.Errorf("request_descriptors[%d].entries[%d]: %s needs a name", i, j, e.From)
			}
			switch e.From {
			case "", rules.FromHeader, rules.FromRemoteAddress, rules.FromPath, rules.FromMethod, rules.FromQuery:
			default:
				return fmt.Errorf("request_descriptors[%d].entries[%d]: unknown source %q", i, j, e.From)
			}
		}
	}
	return nil
}

// Build returns the descriptors specs build from r (rules.RequestDescriptor.Resolve
// with r's values); trusted lists the proxies whose X-Forwarded-For is
// believed (see ClientIP). As in Envoy, a descriptor one of whose values is
// missing (an absent or empty header or query parameter) is not sent.
func Build(r *http.Request, specs []rules.RequestDescriptor, trusted []netip.Prefix) []engine.Descriptor {
	out := make([]engine.Descriptor, 0, len(specs))
	var (
		query  url.Values
		client string
	)
	lookup := func(e rules.RequestEntry) (string, bool) {
		switch e.From {
		case rules.FromHeader:
			v := r.Header.Get(e.Name)
			return v, v != ""
		case rules.FromRemoteAddress:
			if client == "" {
				if ip := ClientIP(r, trusted); ip.IsValid() {
					client = ip.String()
				}
			}
			return client, client != ""
		case rules.FromPath:
			return r.URL.Path, r.URL.Path != ""
		case rules.FromMethod:
			return r.Method, r.Method != ""
		case rules.FromQuery:
			if query == nil {
				query = r.URL.Query()
			}
			v := query.Get(e.Name)
			return v, v != ""
		}
		return "", false
	}
	for _, d := range specs {
		if entries, ok := d.Resolve(lookup, nil); ok && len(entries) > 0 {
			out = append(out, engine.Descriptor{Entries: entries})
		}
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
